"""``--processes P``: P worker processes under one supervisor that restarts a dead child.

A child is *started* once it has told the supervisor it serves (through a pipe, ``READY_ENV``) and stayed up
``start_window_s`` more; one that exits before is a failed start. Restarts after failed starts back off
exponentially; after ``give_up_after`` of them in a row the supervisor stops the others and exits 1, naming
the reason in one line.
A child that exits with ``EXIT_RESTART`` (a sync job outlived its timeout) asked to be replaced: it is
restarted after ``base_s`` and never counts as a failed start. A child that says it is recycling (``RECYCLING``
on the pipe: past ``--max-jobs-per-child`` or ``--max-memory-mb``) is replaced at once, while it finishes its
running jobs. A worker with no supervisor replaces itself (``replace_process``: the same command executed again
in the same process)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import NoReturn

log = logging.getLogger("ringfence.supervisor")

EXIT_RESTART = 75  # the worker's "replace me" exit code (see worker.py)
READY_ENV = "RINGFENCE_SUPERVISOR_FD"  # a supervised worker writes one byte there once it serves
READY, RECYCLING = b"1", b"r"  # what a child writes on that pipe
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}
STOP_FD_ENV = "RINGFENCE_STOP_FD"  # a replaced worker's pipe of the stop signals that reached it before the exec


@dataclass(frozen=True)
class Backoff:
    """How restarts are paced: ``base_s * 2**(n-1)`` after the n-th failed start in a row, at most ``cap_s``."""

    base_s: float = 0.5
    cap_s: float = 30.0
    start_window_s: float = 2.0
    give_up_after: int = 5

    def delay_s(self, failed_starts: int) -> float:
        return float(min(self.base_s * 2.0 ** (failed_starts - 1), self.cap_s))


@dataclass
class Slot:
    index: int
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    ready_fd: int | None = None  # read end of the child's readiness pipe
    ready_at: float | None = None  # when the child said it serves
    proven: bool = False  # served for start_window_s: its start succeeded
    restart_at: float | None = None  # monotonic time of the planned restart
    retiring: list[subprocess.Popen[bytes]] = field(default_factory=list)  # replaced, finishing their jobs


@dataclass
class Supervisor:
    commands: list[list[str]]  # one command per child
    backoff: Backoff = field(default_factory=Backoff)
    slots: list[Slot] = field(default_factory=list)
    failed_starts: int = 0  # children in a row that exited before their start succeeded
    stopping: bool = False

    def spawn(self, slot: Slot) -> None:
        # Its own process group: a terminal's Ctrl-C reaches the supervisor only, which passes on one SIGTERM
        # (a worker takes a second signal as "exit at once"). If the supervisor dies, the children stop too.
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        slot.proc = subprocess.Popen(self.commands[slot.index], process_group=0, preexec_fn=_stop_with_parent,
                                     pass_fds=(write_fd,), env={**os.environ, READY_ENV: str(write_fd)})
        os.close(write_fd)
        slot.ready_fd, slot.ready_at, slot.proven, slot.restart_at = read_fd, None, False, None
        slot.started = time.monotonic()
        log.info("supervisor: started worker %d (pid %d)", slot.index, slot.proc.pid)

    def on_signal(self, signum: int, _frame: object) -> None:
        first = not self.stopping
        self.stopping = True
        for proc in self.children():
            if proc.poll() is None:
                # First signal: a graceful stop; a second one is passed on (children then exit at once).
                proc.send_signal(signal.SIGTERM if first else signum)

    def children(self) -> list[subprocess.Popen[bytes]]:
        return [p for s in self.slots for p in [*s.retiring, s.proc] if p is not None]

    def reap(self, slot: Slot) -> str | None:
        """Handle a child that exited; returns the reason to give up, if any."""
        assert slot.proc is not None
        self.close_pipe(slot)
        code, lived = slot.proc.returncode, time.monotonic() - slot.started
        if code == EXIT_RESTART or slot.proven:
            delay = self.backoff.base_s
        else:
            self.failed_starts += 1
            if self.failed_starts >= self.backoff.give_up_after:
                return (f"{self.failed_starts} workers in a row exited before they started serving "
                        f"(last exit code {code}); see their output above")
            delay = self.backoff.delay_s(self.failed_starts)
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
            self.reap_retired(slot)
            if slot.restart_at is None:
                self.read_pipe(slot, now)
            if slot.restart_at is not None:
                if now >= slot.restart_at and not self.stopping:
                    self.spawn(slot)
                continue
            if slot.proc is not None and slot.proc.poll() is not None:
                reason = self.reap(slot)
                if reason is not None:
                    return reason
            elif not slot.proven and slot.ready_at is not None and now - slot.ready_at >= self.backoff.start_window_s:
                slot.proven = True
                self.failed_starts = 0  # a child that started resets the count
        return None

    def read_pipe(self, slot: Slot, now: float) -> None:
        """What the child said: READY once it serves, RECYCLING once it stops fetching to be replaced."""
        if slot.ready_fd is None:
            return
        try:
            said = os.read(slot.ready_fd, 16)
        except BlockingIOError:
            return
        if not said:  # the child closed it (exiting)
            self.close_pipe(slot)
        if READY in said and slot.ready_at is None:
            slot.ready_at = now
        if RECYCLING in said and slot.proc is not None and not self.stopping:
            log.info("supervisor: worker %d (pid %d) is recycling; starting its replacement", slot.index,
                     slot.proc.pid)
            self.close_pipe(slot)
            slot.retiring.append(slot.proc)
            self.spawn(slot)

    @staticmethod
    def reap_retired(slot: Slot) -> None:
        for proc in [p for p in slot.retiring if p.poll() is not None]:
            slot.retiring.remove(proc)
            log.info("supervisor: recycled worker (pid %d) exited with %d", proc.pid, proc.returncode)

    @staticmethod
    def close_pipe(slot: Slot) -> None:
        if slot.ready_fd is not None:
            os.close(slot.ready_fd)
            slot.ready_fd = None

    def wait_all(self) -> int:
        """Wait for every child; the exit code is the first non-zero one among them (0 when all stopped cleanly)."""
        codes = [slot.proc.wait() for slot in self.slots if slot.proc is not None and slot.restart_at is None]
        for proc in [p for slot in self.slots for p in slot.retiring]:
            proc.wait()  # replaced already: its exit code is not the supervisor's
        bad = [c for c in codes if c != 0]
        return exit_status(bad[0]) if bad else 0


def _stop_with_parent() -> None:
    """In the child before exec: receive SIGTERM when the supervisor dies (Linux), so no worker is orphaned."""
    if sys.platform == "linux":
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


_pipe: list[int] = []  # this supervised worker's end of the pipe, kept to say RECYCLING


def notify_supervisor() -> None:
    """In a supervised worker: tell the supervisor this process serves (no-op when not supervised)."""
    fd = os.environ.pop(READY_ENV, None)
    if fd is not None:
        os.set_inheritable(int(fd), False)  # a handler's own child processes do not hold it open
        _pipe.append(int(fd))
        _tell(READY)


def notify_recycling() -> bool:
    """In a supervised worker: ask for its replacement now (it finishes its running jobs meanwhile). False: not
    supervised, or the supervisor did not hear it."""
    return _tell(RECYCLING)


def _tell(what: bytes) -> bool:
    try:
        return bool(_pipe) and os.write(_pipe[0], what) == len(what)
    except OSError:
        return False  # the supervisor is gone; it stops us anyway


def supervised() -> bool:
    """Is this worker a supervisor's child (read before it serves: ``notify_supervisor`` takes the variable)?"""
    return READY_ENV in os.environ


def catch_stop_signals() -> None:
    """Until the exec, write every stop signal that reaches this process to a pipe its replacement inherits.
    Blocking a signal holds it for the main thread only: one sent to the process may reach another thread
    (a stuck job's), whose Python handler would run after the exec, if at all. The C-level handler writes the
    signal's number to the wake-up fd from whichever thread it runs in."""
    read, write = os.pipe()
    for fd in (read, write):
        os.set_blocking(fd, False)
    os.set_inheritable(read, True)
    signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    os.environ[STOP_FD_ENV] = str(read)


def stop_signal_caught() -> bool:
    """(a replacement, once it handles signals) Did a stop signal reach the process this one replaced?"""
    fd = os.environ.pop(STOP_FD_ENV, None)
    if fd is None:
        return False
    try:
        caught = os.read(int(fd), 64)
    except (OSError, ValueError):
        return False
    finally:
        with contextlib.suppress(OSError, ValueError):
            os.close(int(fd))
    return any(number in STOP_SIGNALS for number in caught)


def hold_stop_signals() -> None:
    """Block SIGTERM and SIGINT: one that comes now stays pending (across an exec too) until released."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)


def release_stop_signals() -> None:
    """(once the worker handles them) Deliver a stop signal held by ``hold_stop_signals``."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def replace_process() -> NoReturn:
    """Execute this process's command line again in place (same process id, so a service manager or a terminal
    keeps it): every thread of the old image ends with it. Call with the stop signals held: one that comes
    meanwhile reaches the new worker once it handles them, as a graceful stop."""
    argv = [sys.executable, *sys.orig_argv[1:]]
    log.warning("replacing this worker process: executing %s again", " ".join(argv))
    for handler in logging.getLogger().handlers:
        handler.flush()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os.execv(sys.executable, argv)


def exit_status(returncode: int) -> int:
    """A child's return code as a shell exit status (killed by signal N → 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


def supervise(commands: list[list[str]], backoff: Backoff | None = None) -> int:
    """Run one child per command; restart any that exits until a stop signal arrives, which is forwarded
    to every child. Returns when all children have exited: 0 when they all stopped
    cleanly, a child's code otherwise, 1 when the supervisor gave up on children that keep failing at start."""
    return Supervisor(commands, backoff or Backoff()).run()
