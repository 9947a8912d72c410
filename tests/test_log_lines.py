"""Each log message is written in one place: the same words logged from several call sites are one function, so
they cannot drift apart and a reader finds the one place that says them."""

from __future__ import annotations

import ast
import collections
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "ringfence"
LEVELS = {"debug", "info", "warning", "error", "exception", "critical"}


def _messages(path: Path) -> list[tuple[str, int]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in LEVELS
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
                and " " in node.args[0].value):  # a sentence, not a one-word key such as INFO's section name
            out.append((node.args[0].value, node.lineno))
    return out


def test_no_log_message_is_written_twice() -> None:
    sites: dict[str, list[str]] = collections.defaultdict(list)
    for path in sorted(SRC.rglob("*.py")):
        for message, line in _messages(path):
            sites[message].append(f"{path.relative_to(SRC)}:{line}")
    assert {m: s for m, s in sites.items() if len(s) > 1} == {}
