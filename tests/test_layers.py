"""Dependencies point one way (docs/architecture.md): only redis/ talks to Redis, only fence/ to SQL, and the
two never import each other (except the pure-data fence.model)."""

from __future__ import annotations

import ast
from pathlib import Path

import ringfence

PKG = Path(ringfence.__file__).parent
APPS = ("demo",)  # the example application: user code, free to use both


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    mod = ".".join(path.relative_to(PKG.parent).with_suffix("").parts)
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = mod.split(".")[: -node.level]
                out.add(".".join([*base, node.module] if node.module else base))
            elif node.module:
                out.add(node.module)
    return out


def modules() -> dict[str, set[str]]:
    found = {}
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG).as_posix()
        if not rel.startswith(APPS):
            found[rel] = imports(path)
    return found


def test_only_redis_package_imports_redis_py() -> None:
    offenders = [m for m, imps in modules().items()
                 if any(i == "redis" or i.startswith("redis.") for i in imps) and not m.startswith("redis/")]
    assert offenders == []


def test_only_fence_and_outbox_packages_import_sqlalchemy() -> None:
    # outbox/ is where SQL and Redis meet for the producer (like the worker's processor for the consumer):
    # it reaches Redis only through ringfence.redis.broker, never redis-py (checked above)
    offenders = [m for m, imps in modules().items()
                 if any(i.startswith("sqlalchemy") for i in imps) and not m.startswith(("fence/", "outbox/"))]
    assert offenders == []


def test_redis_and_fence_do_not_import_each_other() -> None:
    mods = modules()
    fence_to_redis = [m for m, imps in mods.items() if m.startswith("fence/")
                      and any(i.startswith("ringfence.redis") for i in imps)]
    redis_to_fence = [m for m, imps in mods.items() if m.startswith("redis/")
                      and any((i.startswith("ringfence.fence") and i != "ringfence.fence.model")
                              or i.startswith("ringfence.outbox") for i in imps)]
    assert fence_to_redis == [] and redis_to_fence == []


def test_errors_import_nothing_of_ours() -> None:
    assert not [i for i in modules()["errors.py"] if i.startswith("ringfence")]


def test_public_api_is_curated() -> None:
    assert sorted(ringfence.__all__) == sorted(n for n in dir(ringfence) if not n.startswith("_")
                                               and n not in {"annotations"} and not _is_module(n))


def _is_module(name: str) -> bool:
    import types

    return isinstance(getattr(ringfence, name), types.ModuleType)
