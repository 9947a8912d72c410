"""What the doctor reports: findings with a status, the thresholds it judges by, and the check registry."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ringfence.doctor.context import Context


class Status(StrEnum):
    OK = "ok"
    SKIPPED = "skipped"
    WARNING = "warning"
    FAILURE = "failure"


#: Exit code contribution of each status: 0 healthy, 1 warnings, 2 failures.
SEVERITY = {Status.OK: 0, Status.SKIPPED: 0, Status.WARNING: 1, Status.FAILURE: 2}


@dataclass(frozen=True)
class Finding:
    """One observation of one check. ``subject`` (a queue, a server, a dependency) keys alert incidents."""

    check: str
    status: Status
    symptom: str
    hypothesis: str = ""
    remedy: str = ""
    subject: str = ""
    numbers: dict[str, Any] = field(default_factory=dict)

    @property
    def incident_key(self) -> str:
        return f"{self.check}:{self.subject}" if self.subject else self.check

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "status": str(self.status)}


@dataclass(frozen=True)
class Thresholds:
    """Where the doctor and the alert rules draw the line. Durations in seconds; counts in jobs."""

    sample_s: float = 2.0             # doctor: time between the two samples of the counters
    latency_warn_s: float = 60.0      # a queue's oldest pending job is older than this
    starvation_ratio: float = 4.0     # ... while another served queue's latency is below latency_warn_s / ratio
    retry_warn: int = 100             # jobs in one queue's retry set
    retry_growth_warn: int = 20       # retry set growth between two samples
    future_load_warn: int = 10_000    # backlog x remaining attempts of one dependency
    wave_window_s: float = 900.0      # look-back for error waves (bad payloads, newer versions)
    wave_warn: int = 1                # bad_payload dead jobs within the window that make a wave
    orphan_window_s: float = 3600.0   # look-back for orphaned attempts
    stuck_grace_s: float = 30.0       # an expired lease live workers have not recovered after this
    in_doubt_older_than_s: float = 0.0  # in-doubt fences older than this are reported (0: all)
    memory_warn_ratio: float = 0.8    # Redis used_memory / maxmemory: warning from here
    memory_fail_ratio: float = 0.95   # ... failure from here (at maxmemory every enqueue is refused)


@dataclass(frozen=True)
class Check:
    name: str
    ok: str        # the symptom line when the check finds nothing
    run: Callable[[Context], Iterable[Finding]]
    cheap: bool    # cheap enough for an alert rule evaluated every few seconds


CHECKS: list[Check] = []


def check(name: str, ok: str, *, cheap: bool = True) -> Callable[[Callable[[Context], Iterable[Finding]]],
                                                                   Callable[[Context], Iterable[Finding]]]:
    """Register a check function ``fn(ctx) -> findings``; no findings means healthy."""

    def register(fn: Callable[[Context], Iterable[Finding]]) -> Callable[[Context], Iterable[Finding]]:
        CHECKS.append(Check(name, ok, fn, cheap))
        return fn

    return register


@dataclass
class Report:
    """Every check's findings. ``exit_code``: 0 healthy, 1 warnings, 2 failures."""

    namespace: str
    findings: list[Finding]

    @property
    def exit_code(self) -> int:
        return max((SEVERITY[f.status] for f in self.findings), default=0)

    def problems(self) -> list[Finding]:
        return [f for f in self.findings if SEVERITY[f.status] > 0]

    def by_check(self, name: str) -> list[Finding]:
        return [f for f in self.findings if f.check == name]

    def to_dict(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "exit_code": self.exit_code,
                "findings": [f.to_dict() for f in self.findings]}
