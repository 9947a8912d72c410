"""A module of ringfence uses another module's objects through their public names only: no ``obj._name`` on an
object that is not ``self`` (or ``cls``), and no ``from ringfence... import _name``. What a private name hides
can then change inside its own module without breaking another one. The exceptions are listed with the reason
each one stands."""

from __future__ import annotations

import ast
from pathlib import Path

import ringfence

PKG = Path(ringfence.__file__).parent

# (module path under src/ringfence, the expression) -> why it stays
ALLOWED = {
    # a library's private parts, each on a fast path chosen at run time with a public fallback
    # (docs/architecture.md, "A few fast paths read a library's private parts"; tests/test_internals_fallback.py)
    **{("redis/raw_calls.py", expr): "redis-py's connection and parser internals (guarded fast path)"
       for expr in ("conn._sock", "conn._parser", "parser._buffer", "parser._reader", "conn._writer", "conn._reader")},
    ("fence/complete.py", "conn._handle_dbapi_exception"): "SQLAlchemy's error handler (guarded fast path)",
    ("fence/complete.py", "hasattr(Connection, '_handle_dbapi_exception')"): "the guard of that fast path",
    ("redis/raw_calls.py", "getattr(_parsers, '_HiredisParser', None)"): "redis-py's parser class, looked up "
    "for the guarded fast path",
    ("redis/raw_calls.py", "getattr(_parsers, '_AsyncHiredisParser', None)"): "as _HiredisParser",
    ("worker/worker.py", "os._exit"): "the standard library's documented exit without cleanup",
    ("redis/connect.py", "parts._replace"): "a namedtuple's public method (the underscore avoids field names)",
    ("redis/connection.py", "parts._replace"): "a namedtuple's public method (the underscore avoids field names)",
    ("contrib/django/management/commands/ringfence.py", "self.stdout._out"): "Django's OutputWrapper adds a line "
    "ending to every write; the CLI's output goes to the stream it wraps, which Django names only so",
    ("contrib/django/management/commands/ringfence.py", "self.stderr._out"): "as stdout",
    # the module's own class, from a function of the same module
    ("client.py", "Client._ids"): "Client's own static method, called in Client",
    ("client.py", "Client._id"): "Client's own static method, called in Client",
    ("contrib/otel/instrumentor.py", "RingfenceInstrumentor._originals"): "the class's own state, in the class",
    ("oncommit.py", "on_commit._deliver"): "OnCommit's delivery, from the Django hook in the same module",
    **{("redis/connection.py", "settings._options"): "ConnectionSettings' client options, read by the client "
       "factories of the same module"},
}


def _uses() -> list[tuple[str, str]]:
    found = []
    for path in sorted(PKG.rglob("*.py")):
        rel = str(path.relative_to(PKG))
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
                found.append((rel, ast.unparse(node)))
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) > 1
                    and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
                    and node.args[1].value.startswith("_") and not node.args[1].value.startswith("__")):
                found.append((rel, ast.unparse(node)))
    return found


def test_no_module_reads_another_objects_private_attribute() -> None:
    extra = sorted({use for use in _uses() if use not in ALLOWED})
    assert extra == []


def test_every_allowed_private_use_is_still_there() -> None:
    """An exception whose use went away is removed from the list."""
    assert sorted(set(ALLOWED) - set(_uses())) == []


def test_no_module_imports_another_modules_private_name() -> None:
    found = []
    for path in sorted(PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("ringfence")):
                found += [f"{path.relative_to(PKG)}: {'.' * node.level}{node.module or ''}.{a.name}"
                          for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
    assert found == []
