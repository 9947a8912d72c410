"""What the doctor reports: findings with a status, and the check registry."""

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
