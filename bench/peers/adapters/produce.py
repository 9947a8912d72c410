"""The producer side of an adapter, run in the library's venv: ``python produce.py MODULE``.

Reads one JSON command per line from stdin, answers one JSON line on stdout. ``MODULE`` (``peer_<lib>``)
defines ``Producer`` (sync: ``one(sent, sleep)``, ``bulk(n)``, ``close()``) or ``AsyncProducer`` (the same as
coroutines, plus ``start()``). Ops: ``warm``, ``single n``, ``bulk n``, ``rate rate seconds``, ``sleeper``,
``memory n``.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
import time
import traceback
from typing import Any

import peerjob
import redis


class Driver:
    def __init__(self, module: Any) -> None:
        self.loop = asyncio.new_event_loop()
        if hasattr(module, "AsyncProducer"):
            self.inner = module.AsyncProducer()
            self.is_async = True
            self.run(self.inner.start())
        else:
            self.inner = module.Producer()
            self.is_async = False

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def one(self, sent: float = 0.0, sleep: float = 0.0) -> None:
        if self.is_async:
            self.run(self.inner.one(sent, sleep))
        else:
            self.inner.one(sent, sleep)

    def single(self, n: int, budget_s: float = 1e9) -> dict[str, float]:
        """Up to ``n`` sequential enqueues, stopping early after ``budget_s``."""
        async def aloop() -> int:
            for i in range(n):
                await self.inner.one(0.0, 0.0)
                if i % 100 == 99 and time.perf_counter() > deadline:
                    return i + 1
            return n

        def loop() -> int:
            for i in range(n):
                self.inner.one(0.0, 0.0)
                if i % 100 == 99 and time.perf_counter() > deadline:
                    return i + 1
            return n

        t0 = time.perf_counter()
        deadline = t0 + budget_s
        done = self.run(aloop()) if self.is_async else loop()
        return {"n": done, "seconds": time.perf_counter() - t0}

    def bulk(self, n: int, budget_s: float = 1e9) -> dict[str, float]:
        """Up to ``n`` jobs through the bulk path in calls of 1,000, stopping early after ``budget_s``."""
        t0 = time.perf_counter()
        done = 0
        while done < n and (done == 0 or time.perf_counter() - t0 < budget_s):
            chunk = min(1000, n - done)
            if self.is_async:
                self.run(self.inner.bulk(chunk))
            else:
                self.inner.bulk(chunk)
            done += chunk
        return {"n": done, "seconds": time.perf_counter() - t0}

    def rate(self, rate: float, seconds: float) -> dict[str, float]:
        """Stamped jobs at a steady rate on an absolute schedule (no drift)."""
        n = int(rate * seconds)
        t0 = time.perf_counter()
        for i in range(n):
            pause = t0 + i / rate - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            self.one(time.time(), 0.0)
        return {"n": n, "achieved": n / (time.perf_counter() - t0)}

    def memory(self, n: int, budget_s: float) -> float:
        client = redis.Redis.from_url(peerjob.BROKER_URL)
        self.one()  # the queue's own keys exist before the measure
        before = int(client.info("memory")["used_memory"])
        n = int(self.single(n, budget_s)["n"])
        after = int(client.info("memory")["used_memory"])
        client.close()
        return (after - before) / n

    def handle(self, cmd: dict[str, Any]) -> dict[str, Any]:
        op = cmd["op"]
        if op == "warm":
            self.one()
            return {}
        if op == "single":
            return self.single(cmd["n"], cmd.get("budget_s", 1e9))
        if op == "bulk":
            return self.bulk(cmd["n"], cmd.get("budget_s", 1e9))
        if op == "rate":
            return self.rate(cmd["rate"], cmd["seconds"])
        if op == "sleeper":
            self.one(time.time(), cmd["seconds"])
            return {}
        if op == "memory":
            return {"bytes_per_job": self.memory(cmd["n"], cmd.get("budget_s", 1e9))}
        raise ValueError(f"unknown op {op!r}")

    def close(self) -> None:
        if self.is_async:
            self.run(self.inner.close())
        else:
            self.inner.close()
        self.loop.close()


def main() -> None:
    driver = Driver(importlib.import_module(sys.argv[1]))
    try:
        for line in sys.stdin:
            try:
                answer = driver.handle(json.loads(line))
            except Exception as exc:  # reported to the harness, which marks the library failed
                traceback.print_exc()
                answer = {"error": f"{type(exc).__name__}: {exc}"}
            sys.stdout.write(json.dumps(answer) + "\n")
            sys.stdout.flush()
    finally:
        driver.close()


if __name__ == "__main__":
    main()
