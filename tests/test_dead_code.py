"""No function, method or class in src/ringfence is defined and never named anywhere else (src, tests, bench,
examples, docs): code nothing calls is code a reader must still read. Decorated definitions are registered by
their decorator (click commands, SQLAlchemy compilers); ``HOOKS`` are called by a framework or a user by name."""

from __future__ import annotations

import ast
import collections
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEXT = (".py", ".lua", ".html", ".js", ".md", ".toml", ".txt")
HOOKS = {
    # Django calls these by name
    "FenceAdmin", "FailedJobAdmin", "OutboxAdmin", "RingfenceConfig", "has_add_permission",
    "has_change_permission", "has_delete_permission", "has_resolve_permission", "has_replay_permission",
    "run_from_argv", "add_arguments",
    # redis-py's Backoff: Retry asks it before each resend
    "compute",
}


def _words() -> collections.Counter[str]:
    words: collections.Counter[str] = collections.Counter()
    for top in ("src", "tests", "bench", "examples", "docs"):
        for path in (ROOT / top).rglob("*"):
            if path.suffix in TEXT and ".venvs" not in path.parts and path.is_file():
                words.update(re.findall(r"\w+", path.read_text(errors="replace")))
    return words


def _defined(path: Path) -> list[tuple[str, int]]:
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return [(node.name, node.lineno) for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, kinds) and not node.decorator_list and not node.name.startswith("__")]


def test_every_definition_is_named_somewhere_else() -> None:
    words = _words()
    unused = [f"{path.relative_to(ROOT)}:{line} {name}" for path in sorted((ROOT / "src").rglob("*.py"))
              for name, line in _defined(path) if words[name] <= 1 and name not in HOOKS]
    assert unused == []
