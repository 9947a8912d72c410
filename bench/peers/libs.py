"""The libraries compared: how each one's venv is made, its worker started and its jobs produced.

Workers start as each library's docs say, with default settings; the only flag set is the number of
processes where the library has one (otherwise N separate worker commands are started).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
ADAPTERS = os.path.join(HERE, "adapters")
VENVS = os.path.join(HERE, ".venvs")


@dataclass(frozen=True)
class Lib:
    name: str                                     # as in --only
    label: str                                    # in tables and charts
    venv: str                                     # bench/peers/.venvs/<venv>, from requirements-<venv>.txt
    package: str                                  # whose version the report shows
    producer: str                                 # adapter module run by produce.py
    kind: str                                     # "sync" (def handlers) or "async" (async def)
    argvs: Callable[[str, int, str], list[list[str]]]  # (venv bin, processes, broker URL) -> commands
    how: str                                      # the worker command, for the docs

    def bin(self) -> str:
        return os.path.join(VENVS, self.venv, "bin")

    def worker_argvs(self, processes: int, broker_url: str) -> list[list[str]]:
        return self.argvs(self.bin(), processes, broker_url)


def _each(*argv: str) -> Callable[[str, int, str], list[list[str]]]:
    """One worker command per process (libraries without a processes option)."""
    return lambda b, n, url: [[os.path.join(b, argv[0]), *argv[1:]] for _ in range(n)]


LIBS = [
    Lib("celery", "Celery", "celery", "celery", "peer_celery", "sync",
        lambda b, n, url: [[os.path.join(b, "celery"), "-A", "peer_celery", "worker", "--concurrency", str(n)]],
        "celery -A peer_celery worker --concurrency N (prefork pool)"),
    Lib("rq", "RQ", "rq", "rq", "peer_rq", "sync",
        lambda b, n, url: [[os.path.join(b, "rq"), "worker", "--url", url, "peers"]
                      for _ in range(n)],
        "rq worker --url URL peers, N times"),
    Lib("dramatiq", "Dramatiq", "dramatiq", "dramatiq", "peer_dramatiq", "sync",
        lambda b, n, url: [[os.path.join(b, "dramatiq"), "peer_dramatiq", "--processes", str(n)]],
        "dramatiq peer_dramatiq --processes N (8 threads each)"),
    Lib("huey", "Huey", "huey", "huey", "peer_huey", "sync", _each("huey_consumer", "peer_huey.huey"),
        "huey_consumer peer_huey.huey, N times (1 worker thread each)"),
    Lib("arq", "arq", "arq", "arq", "peer_arq", "async", _each("arq", "peer_arq.WorkerSettings"),
        "arq peer_arq.WorkerSettings, N times"),
    Lib("saq", "SAQ", "saq", "saq", "peer_saq", "async",
        lambda b, n, url: [[os.path.join(b, "saq"), "peer_saq.settings", "--workers", str(n)]],
        "saq peer_saq.settings --workers N"),
    Lib("taskiq", "taskiq", "taskiq", "taskiq", "peer_taskiq", "async",
        lambda b, n, url: [[os.path.join(b, "taskiq"), "worker", "peer_taskiq:broker", "--workers", str(n)]],
        "taskiq worker peer_taskiq:broker --workers N"),
    Lib("ringfence", "ringfence (def)", "ringfence", "ringfence", "peer_ringfence", "sync",
        _each("ringfence", "worker", "--app", "peer_ringfence:sync_app", "--queues", "peers"),
        "ringfence worker --app peer_ringfence:sync_app --queues peers, N times"),
    Lib("ringfence-async", "ringfence (async def)", "ringfence", "ringfence", "peer_ringfence_async", "async",
        _each("ringfence", "worker", "--app", "peer_ringfence:async_app", "--queues", "peers"),
        "ringfence worker --app peer_ringfence:async_app --queues peers, N times"),
]
BY_NAME = {lib.name: lib for lib in LIBS}
