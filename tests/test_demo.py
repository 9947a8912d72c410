"""``ringfence demo`` end to end: real worker processes SIGKILLed after the provider's 200."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

pytestmark = pytest.mark.slow


def test_demo_naive_charges_twice_fenced_charges_once() -> None:
    # A short private TMPDIR: the demo's temp dir must be gone afterwards (and a unix socket path stays short).
    tmp = tempfile.mkdtemp(prefix="rfd")
    try:
        out = subprocess.run(
            [sys.executable, "-m", "ringfence.cli", "demo", "--orders", "40", "--workers", "2", "--json"],
            capture_output=True, timeout=110, check=True, env={**os.environ, "TMPDIR": tmp},
        )
        assert os.listdir(tmp) == []  # torn down: redis dir, SQLite files, logs
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    figures = json.loads(out.stdout)  # stdout is pure JSON: the progress bar went to stderr
    naive, fenced = figures["naive"], figures["fenced"]
    keys = {"orders", "charges", "double_charged_orders", "fence_rows", "in_doubt", "dead"}
    assert keys <= set(naive) and keys <= set(fenced)

    assert naive["kills"] > 0 and fenced["kills"] > 0, figures  # the chaos did happen
    assert naive["double_charged_orders"] > 0 and naive["charges"] > naive["orders"], figures
    assert naive["fence_rows"] == 0

    assert fenced["orders"] == 40
    assert fenced["charges"] == 40 and fenced["double_charged_orders"] == 0, figures
    assert fenced["fence_rows"] == 40 and fenced["in_doubt"] == 0 and fenced["dead"] == 0, figures
