"""docs/tutorial.md followed the way a reader does: in an empty folder, each file it shows written in order, each
shell command it shows run in order in one shell session (its working directory and environment carried from
block to block), the ones that run until stopped (worker, relay) started in the background and stopped with
Ctrl-C at the end, each output it shows compared with what the command printed.

Markers in the page (HTML comments, invisible when rendered): ``<!-- file: PATH -->`` before a code block that
is that file; ``<!-- runs until stopped -->`` before a long-running command; ``<!-- repeated until the output
shows -->`` before a command whose output shows the work of a background process. A plain code block right
after a command is that command's output: each of its lines must be in a line the command printed. The one
substitution: ``/path/to/ringfence`` is this checkout."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from support import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # venvs built with pip: minutes on a busy machine

DOC = ROOT / "docs" / "tutorial.md"
EXAMPLE = ROOT / "examples" / "tutorial"
BLOCK = re.compile(r"(?:<!-- (?P<marker>[^>]*?) -->\n)?```(?P<lang>\w*)\n(?P<body>.*?)```", re.DOTALL)


@dataclass
class Block:
    lang: str  # python, bash, or "" (an output)
    marker: str
    body: str


def blocks() -> list[Block]:
    return [Block(m["lang"], m["marker"] or "", m["body"]) for m in BLOCK.finditer(DOC.read_text())]


class Shell:
    """One shell session: each command runs in bash where the previous one left its directory and environment."""

    def __init__(self, folder: Path, env: dict[str, str]) -> None:
        self.cwd, self.env, self.state = folder, env, folder.parent / "shell-state"
        self.state.mkdir()
        self.background: list[subprocess.Popen[bytes]] = []

    def run(self, command: str) -> str:
        script = f"set -e\n{command}\npwd > {self.state}/cwd\nenv -0 > {self.state}/env\n"
        done = subprocess.run(["bash", "-c", script], cwd=self.cwd, env=self.env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, f"{command!r} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        self.cwd = Path((self.state / "cwd").read_text().strip())
        pairs = (item.split("=", 1) for item in (self.state / "env").read_text().split("\0") if "=" in item)
        self.env = dict(pairs)
        return done.stdout

    def start(self, command: str) -> None:
        log = open(self.state / f"background-{len(self.background)}.log", "wb")  # noqa: SIM115 (kept open)
        self.background.append(subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=self.cwd, env=self.env,
                                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    def stop_background(self) -> list[int]:
        """Ctrl-C to each background command, as the reader stops it; their exit codes."""
        codes = []
        for proc in self.background:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
            try:
                codes.append(proc.wait(30))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                codes.append(proc.wait(10))
        return codes

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.state.glob("background-*.log")))


@pytest.fixture
def shell(tmp_path: Path, redis_url: str) -> Iterator[Shell]:
    """An empty folder and the reader's environment: this checkout's venv not active, Redis at ``redis_url`` under
    a namespace of the test's own."""
    namespace = f"ttu{uuid.uuid4().hex[:10]}"
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if not p.startswith(str(ROOT)))
    env.update(REDIS_URL=redis_url, RINGFENCE_NAMESPACE=namespace)
    folder = tmp_path / "reader"
    folder.mkdir()
    s = Shell(folder, env)
    yield s
    s.stop_background()
    r = redis.Redis.from_url(redis_url)
    keys = list(r.scan_iter(f"{namespace}:*", count=1000))
    if keys:
        r.delete(*keys)


def shown_lines_in(expected: str, printed: str) -> list[str]:
    """The lines of ``expected`` that are in no line of ``printed``."""
    return [line for line in expected.splitlines() if not any(line in got for got in printed.splitlines())]


def test_the_tutorial_followed_as_written(shell: Shell) -> None:
    found = blocks()
    for at, block in enumerate(found):
        if block.lang == "python" and block.marker.startswith("file: "):
            (shell.cwd / block.marker.removeprefix("file: ")).write_text(block.body)  # its folder made by a step
        elif block.lang == "bash" and block.marker == "runs until stopped":
            shell.start(block.body.strip())
        elif block.lang == "bash":
            command = block.body.replace("/path/to/ringfence", str(ROOT))
            shown = found[at + 1].body if at + 1 < len(found) and found[at + 1].lang == "" else ""
            printed = _run(shell, command, repeat=block.marker == "repeated until the output shows", expect=shown)
            missing = shown_lines_in(shown, printed)
            assert missing == [], (command, missing, printed, shell.logs())
    assert shell.stop_background() == [0, 0], shell.logs()


def _run(shell: Shell, command: str, *, repeat: bool, expect: str) -> str:
    deadline = time.monotonic() + (30 if repeat else 0)
    while True:
        printed = shell.run(command)
        if not repeat or not shown_lines_in(expect, printed) or time.monotonic() > deadline:
            return printed
        time.sleep(0.5)


def test_the_naive_charge_fails_the_check_the_tutorial_shows(shell: Shell) -> None:
    """Step 2's claim, with the reader's files: assert_second_run_empty refuses the naive charge."""
    for block in blocks():
        if block.lang == "python" and block.marker.startswith("file: "):
            path = shell.cwd / "shop" / block.marker.removeprefix("file: ")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block.body)
    (shell.cwd / "shop" / "myshop" / "__init__.py").touch()
    check = ("import tests.conftest\n"  # the tests' own shop database and ledger
             "from myshop.db import engine, metadata\nfrom ringfence.fence import create_all\n"
             "metadata.create_all(engine)\ncreate_all(engine)\n"
             "from myshop.naive import charge_order_naive\nfrom tests.test_charge import new_order\n"
             "from myshop.payments import psp\nfrom ringfence.testing import assert_second_run_empty\n"
             "assert_second_run_empty(charge_order_naive, payload=lambda n: {'order_id': new_order(5), 'amount': 5},"
             " effects=lambda: psp.effects)\n")
    done = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-c", check], cwd=shell.cwd / "shop",
                          env={**shell.env, "PYTHONPATH": str(shell.cwd / "shop")}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1 and "AssertionError" in done.stderr, done.stderr
    assert "the rerun made 1 more effect" in done.stderr


def test_examples_tutorial_holds_the_files_the_tutorial_shows() -> None:
    shown = {b.marker.removeprefix("file: "): b.body for b in blocks() if b.marker.startswith("file: ")}
    assert len(shown) >= 9
    for path, body in shown.items():
        assert (EXAMPLE / path).read_text() == body, f"examples/tutorial/{path} differs from docs/tutorial.md"
    on_disk = {str(p.relative_to(EXAMPLE)) for p in EXAMPLE.rglob("*.py") if p.stat().st_size}
    assert on_disk == set(shown)
