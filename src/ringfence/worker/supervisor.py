"""``--processes P``: P worker processes under one supervisor that restarts a dead child."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time

log = logging.getLogger("ringfence.supervisor")


def supervise(child_argv: list[str], processes: int, restart_delay_s: float = 1.0) -> int:
    """Run ``processes`` copies of ``child_argv``; restart any that exits until a stop signal arrives,
    which is forwarded to every child. Returns when all children have exited."""
    children: dict[int, subprocess.Popen[bytes]] = {}
    stopping = False

    def spawn(slot: int) -> None:
        children[slot] = subprocess.Popen(child_argv)
        log.info("supervisor: started worker %d (pid %d)", slot, children[slot].pid)

    def stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        if stopping:  # second signal: pass it on, children exit at once
            for p in children.values():
                p.send_signal(signum)
            return
        stopping = True
        for p in children.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for slot in range(processes):
        spawn(slot)
    while not (stopping and all(p.poll() is not None for p in children.values())):
        for slot, p in list(children.items()):
            code = p.poll()
            if code is not None and not stopping:
                log.warning("supervisor: worker %d (pid %d) exited with %d; restarting in %gs",
                            slot, p.pid, code, restart_delay_s)
                time.sleep(restart_delay_s)
                if not stopping:
                    spawn(slot)
        time.sleep(0.2)
    return 0


def child_command(argv: list[str]) -> list[str]:
    """This process's worker command with ``--processes`` removed."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--processes":
            skip = True
            continue
        if arg.startswith("--processes="):
            continue
        out.append(arg)
    return [sys.executable, "-m", "ringfence.cli", *out]
