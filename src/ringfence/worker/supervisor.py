"""``--processes P``: P worker processes under one supervisor that restarts a dead child.

Restarts back off exponentially while children keep dying soon after they start; after ``give_up_after``
such deaths in a row the supervisor stops the others and exits non-zero, naming the reason in one line.
A child that exits with ``EXIT_RESTART`` (a sync job outlived its timeout) asked to be replaced: it is
restarted after ``base_s`` and never counts as a failed start."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

log = logging.getLogger("ringfence.supervisor")

EXIT_RESTART = 75  # the worker's "replace me" exit code (see worker.py)


@dataclass(frozen=True)
class Backoff:
    """How restarts are paced: ``base_s * 2**n`` after the n-th quick death in a row, at most ``cap_s``;
    a child is "quick" when it dies within ``start_window_s`` of its start."""

    base_s: float = 0.5
    cap_s: float = 30.0
    start_window_s: float = 5.0
    give_up_after: int = 5

    def delay_s(self, quick_deaths: int) -> float:
        return min(self.base_s * 2 ** max(quick_deaths - 1, 0), self.cap_s) if quick_deaths else self.base_s


@dataclass
class Slot:
    index: int
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    proven: bool = False  # stayed up past the start window
    restart_at: float | None = None  # monotonic time of the planned restart


@dataclass
class Supervisor:
    commands: list[list[str]]  # one command per child
    backoff: Backoff = field(default_factory=Backoff)
    slots: list[Slot] = field(default_factory=list)
    quick_deaths: int = 0  # children in a row that died within start_window_s of their start
    stopping: bool = False

    def spawn(self, slot: Slot) -> None:
        # Its own process group: a terminal's Ctrl-C reaches the supervisor only, which passes on one SIGTERM
        # (a worker takes a second signal as "exit at once"). If the supervisor dies, the children stop too.
        slot.proc = subprocess.Popen(self.commands[slot.index], process_group=0, preexec_fn=_stop_with_parent)
        slot.started = time.monotonic()
        slot.proven = False
        slot.restart_at = None
        log.info("supervisor: started worker %d (pid %d)", slot.index, slot.proc.pid)

    def on_signal(self, signum: int, _frame: object) -> None:
        first = not self.stopping
        self.stopping = True
        for slot in self.slots:
            if slot.proc is not None and slot.proc.poll() is None:
                # First signal: a graceful stop; a second one is passed on (children then exit at once).
                slot.proc.send_signal(signal.SIGTERM if first else signum)

    def reap(self, slot: Slot) -> str | None:
        """Handle a child that exited; returns the reason to give up, if any."""
        assert slot.proc is not None
        code, lived = slot.proc.returncode, time.monotonic() - slot.started
        if code == EXIT_RESTART:
            delay = self.backoff.base_s
        elif lived < self.backoff.start_window_s:
            self.quick_deaths += 1
            if self.quick_deaths >= self.backoff.give_up_after:
                return (f"{self.quick_deaths} workers in a row exited within {self.backoff.start_window_s:g}s of "
                        f"starting (last exit code {code}); see their output above")
            delay = self.backoff.delay_s(self.quick_deaths)
        else:
            self.quick_deaths = 0
            delay = self.backoff.base_s
        log.warning("supervisor: worker %d (pid %d) exited with %d after %.1fs; restarting in %gs",
                    slot.index, slot.proc.pid, code, lived, delay)
        slot.restart_at = time.monotonic() + delay
        return None

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self.on_signal)
        signal.signal(signal.SIGINT, self.on_signal)
        self.slots = [Slot(i) for i in range(len(self.commands))]
        for slot in self.slots:
            self.spawn(slot)
        while not self.stopping:
            reason = self.step()
            if reason is not None:
                log.error("supervisor: giving up: %s", reason)
                self.on_signal(signal.SIGTERM, None)
                self.wait_all()
                return 1
            time.sleep(0.1)
        return self.wait_all()

    def step(self) -> str | None:
        now = time.monotonic()
        for slot in self.slots:
            if slot.restart_at is not None:
                if now >= slot.restart_at and not self.stopping:
                    self.spawn(slot)
                continue
            if slot.proc is not None and slot.proc.poll() is not None:
                reason = self.reap(slot)
                if reason is not None:
                    return reason
            elif slot.proc is not None and not slot.proven and now - slot.started >= self.backoff.start_window_s:
                slot.proven = True
                self.quick_deaths = 0  # a newly started child that stayed up resets the count
        return None

    def wait_all(self) -> int:
        """Wait for every child; the exit code is the first non-zero one among them (0 when all stopped cleanly)."""
        codes = [slot.proc.wait() for slot in self.slots if slot.proc is not None and slot.restart_at is None]
        bad = [c for c in codes if c != 0]
        return exit_status(bad[0]) if bad else 0


def _stop_with_parent() -> None:
    """In the child before exec: receive SIGTERM when the supervisor dies (Linux), so no worker is orphaned."""
    if sys.platform == "linux":
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def exit_status(returncode: int) -> int:
    """A child's return code as a shell exit status (killed by signal N → 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


def supervise(commands: list[list[str]], backoff: Backoff | None = None) -> int:
    """Run one child per command; restart any that exits until a stop signal arrives, which is forwarded
    to every child. Returns when all children have exited: 0 when they all stopped
    cleanly, a child's code otherwise, 1 when the supervisor gave up on children that keep failing at start."""
    return Supervisor(commands, backoff or Backoff()).run()
