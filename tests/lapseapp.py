"""The app of tests/test_lease_lapse.py's workers: a sync handler that waits for the test's go-ahead (a file)
before opening its fenced step, so the test can stop the process there until its lease lapses; the effect
appends to a file, the charges the test counts."""

from __future__ import annotations

import time
from pathlib import Path

from support import worker_app

app = worker_app(fence=True)


@app.task(name="charge", max_attempts=1)
def charge(ctx, where: str, dedup: bool) -> None:
    here = Path(where)
    (here / f"started-{ctx.attempt}").write_text(ctx.token)
    while not (here / "go").exists():
        time.sleep(0.005)
    window = {"provider_dedup": True, "key_window_s": 3600.0} if dedup else {}
    try:
        with ctx.fence("order:1", "charge", params={"amount": 5}, **window) as step:
            step.effect(lambda: _charge(here))
    finally:
        (here / f"finished-{ctx.attempt}").write_text("")


def _charge(here: Path) -> str:
    with (here / "charges").open("a") as f:
        f.write("ch_1\n")
    return "ch_1"
