"""The run's worker processes: spawned, SIGKILLed, SIGTERMed, restarted, and how each one ended."""

from __future__ import annotations

import os
import random
import signal
import sys
import time
from dataclasses import dataclass, field

from bench.chaos.stack import FAKETIME_LIB, Stack, WorkerProc, python_env

SKEW_SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "skewsite")


@dataclass
class Exits:
    """How worker processes ended, by cause (the driver's kills are counted where they are sent)."""

    self_killed: int = 0                                       # SIGKILL not sent by the driver: fault points, doomed
    term_seconds: list[float] = field(default_factory=list)    # SIGTERM → exit, per graceful stop
    hung: int = 0                                              # no exit within the bound after SIGTERM
    other: dict[int, int] = field(default_factory=dict)        # exit code → count (crashes, refusals)


class Workers:
    """Keeps ``count`` worker processes running; slot 0 runs with a skewed clock when asked."""

    def __init__(self, stack: Stack, env: dict[str, str], count: int, concurrency: int,
                 skew_s: float | None, term_bound_s: float) -> None:
        self.stack, self.env, self.count, self.concurrency = stack, env, count, concurrency
        self.skew_s, self.term_bound_s = skew_s, term_bound_s
        self.faults_env: str | None = None  # RINGFENCE_FAULTS for workers spawned from now on
        self.procs: list[WorkerProc] = []
        self.exits = Exits()
        self.ends: list[tuple[str, int, float]] = []  # (killed | termed | self_killed, pid, wall-clock end)

    def tag(self, slot: int) -> str:
        return "skew" if slot == 0 and self.skew_s is not None else f"w{slot}"

    def spawn(self, slot: int) -> WorkerProc:
        env = {**self.env, "CHAOS_WORKER_TAG": self.tag(slot)}
        if self.faults_env:
            env["RINGFENCE_FAULTS"] = self.faults_env
        if slot == 0 and self.skew_s is not None:
            env.update(LD_PRELOAD=FAKETIME_LIB, FAKETIME=f"{self.skew_s:+g}", FAKETIME_DONT_FAKE_MONOTONIC="1",
                       FAKETIME_NO_CACHE="1")
        argv = [sys.executable, "-m", "ringfence.cli", "--log-level", "WARNING", "worker",
                "--app", "bench.chaos.app:app", "--queues", "chaos", "--concurrency", str(self.concurrency)]
        full = python_env(**env)
        if slot == 0 and self.skew_s is not None:  # time.sleep fails under libfaketime: skewsite/sitecustomize.py
            full["PYTHONPATH"] = f"{SKEW_SITE}{os.pathsep}{full['PYTHONPATH']}"
        proc = WorkerProc(slot, self.tag(slot), self.stack.spawn(argv, full, f"worker-{slot}.log"))
        return proc

    def start(self) -> None:
        self.procs = [self.spawn(slot) for slot in range(self.count)]

    def alive(self) -> list[WorkerProc]:
        """Running workers no fault has hit yet (a SIGKILLed one may not be reaped by the time a SIGTERM fires in the
        same tick: it is no candidate)."""
        return [w for w in self.procs if w.popen.poll() is None and w.termed_at is None and not w.killed]

    def ended(self, kind: str) -> int:
        return sum(1 for k, _, _ in self.ends if k == kind)

    def kill_random(self) -> int | None:
        candidates = self.alive()
        if not candidates:
            return None
        w = random.choice(candidates)
        w.killed = True
        os.kill(w.pid, signal.SIGKILL)
        self.ends.append(("killed", w.pid, time.time()))
        return w.pid

    def term(self, w: WorkerProc) -> None:
        w.termed_at = time.monotonic()
        w.popen.send_signal(signal.SIGTERM)
        self.ends.append(("termed", w.pid, time.time()))

    def term_random(self) -> int | None:
        candidates = self.alive()
        if not candidates:
            return None
        w = random.choice(candidates)
        self.term(w)
        return w.pid

    def supervise(self, restart: bool = True) -> None:
        """Account for every exited worker and restart its slot; SIGKILL a worker hung after SIGTERM."""
        for i, w in enumerate(self.procs):
            code = w.popen.poll()
            now = time.monotonic()
            if code is None:
                if w.termed_at is not None and now - w.termed_at > self.term_bound_s:
                    self.exits.hung += 1
                    os.killpg(w.pid, signal.SIGKILL)
                    w.popen.wait(10)
                    w.termed_at = None  # counted once, as hung
                    w.killed = True
                continue
            if w.termed_at is not None:
                ended = w.exited_at if w.exited_at is not None else now  # the reaper sets it right after the code
                self.exits.term_seconds.append(ended - w.termed_at)
                if ended - w.termed_at > self.term_bound_s:
                    self.exits.hung += 1
            elif code == -signal.SIGKILL and not w.killed:
                self.exits.self_killed += 1
                self.ends.append(("self_killed", w.pid, time.time()))
            elif not w.killed:
                self.exits.other[code] = self.exits.other.get(code, 0) + 1
            if restart:
                self.procs[i] = self.spawn(w.slot)

    def stop_all(self) -> None:
        """SIGTERM every worker at once and wait (bounded) for each to exit."""
        for w in self.procs:
            if w.popen.poll() is None:
                self.term(w)
        deadline = time.monotonic() + self.term_bound_s + 1
        while any(w.popen.poll() is None for w in self.procs) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.supervise(restart=False)
        for w in self.procs:
            if w.popen.poll() is None:  # past the bound: hung
                self.exits.hung += 1
                os.killpg(w.pid, signal.SIGKILL)
                w.popen.wait(10)
