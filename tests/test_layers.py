"""Dependencies point one way (docs/architecture.md, "Layers"): the module graph has no cycle, each layer
imports only the layers below it, only redis/ talks to Redis, only fence/ to SQL, and the two never import
each other.

Every import counts, wherever it is written: at the top, inside a function, or under ``TYPE_CHECKING`` (a
cycle that only the type checker sees is still a circle a reader has to untangle)."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import ringfence

PKG = Path(ringfence.__file__).parent
APPS = ("ringfence.demo",)  # the example application: user code, free to use everything

# Lowest first. A module may import its own layer's modules and anything below, never above. A name is a
# module or a package (all its modules); the most specific name decides. Keep in step with
# docs/architecture.md.
LAYERS: list[tuple[str, ...]] = [
    ("ringfence.errors",),
    ("ringfence.faults", "ringfence.offloop", "ringfence.settings", "ringfence.models", "ringfence.logs",
     "ringfence.fake_provider", "ringfence.notify"),
    ("ringfence.payloads", "ringfence.fence.model", "ringfence.fence_api"),
    ("ringfence.redis", "ringfence.fence", "ringfence.tasks"),
    ("ringfence.client", "ringfence.scheduler", "ringfence.queries", "ringfence.runtime", "ringfence.worker.loop",
     "ringfence.outbox", "ringfence.oncommit"),
    ("ringfence.jobs",),
    ("ringfence.results", "ringfence.workflows"),
    ("ringfence.app",),
    ("ringfence.doctor", "ringfence.reconcile", "ringfence.metrics", "ringfence.alerts", "ringfence.contracts",
     "ringfence.outbox.lag"),
    ("ringfence.worker", "ringfence.outbox.relay", "ringfence.outbox.loop"),
    ("ringfence.dashboard", "ringfence.testing", "ringfence.demo"),
    ("ringfence.cli",),
    ("ringfence.contrib",),  # framework integrations (Django): user-side glue over the CLI and the App
    ("ringfence",),
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def graph() -> dict[str, frozenset[str]]:
    """Module -> the modules of ours it imports (``from pkg import mod`` is an import of ``pkg.mod``)."""
    paths = {module_name(p): p for p in PKG.rglob("*.py")}
    out: dict[str, frozenset[str]] = {}
    for mod, path in paths.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    source = ".".join([*base, node.module] if node.module else base)
                else:
                    source = node.module or ""
                for alias in node.names:
                    sub = f"{source}.{alias.name}"
                    found.add(sub if sub in paths else source)
        deps = set()
        for name in found:
            while name and name not in paths:
                name = name.rpartition(".")[0]
            if name.startswith("ringfence") and name != mod:
                deps.add(name)
        out[mod] = frozenset(deps)
    return out


def raw_imports() -> dict[str, set[str]]:
    """Module -> every module name it imports, ours or not (for the third-party rules)."""
    out: dict[str, set[str]] = {}
    for path in PKG.rglob("*.py"):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names.add(node.module)
        out[module_name(path)] = names
    return out


def cycles() -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    g = graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return found


def layer_of(mod: str) -> int:
    best, depth = -1, -1
    for i, names in enumerate(LAYERS):
        for name in names:
            inside = mod == name or (mod.startswith(name + ".") and name != "ringfence")  # the root: only itself
            if inside and name.count(".") > depth:
                best, depth = i, name.count(".")
    return best


def test_the_module_graph_has_no_cycle() -> None:
    found = cycles()
    detail = [f"{c}: " + "; ".join(f"{m} -> {sorted(d for d in graph()[m] if d in c)}" for m in c) for c in found]
    assert detail == []


def test_every_module_has_a_layer() -> None:
    assert [m for m in graph() if layer_of(m) < 0] == []


def test_imports_point_down_the_layers() -> None:
    upward = [f"{m} (layer {layer_of(m)}) imports {d} (layer {layer_of(d)})" for m, deps in graph().items()
              if not m.startswith(APPS) for d in deps if layer_of(d) > layer_of(m)]
    assert upward == []


def test_only_redis_package_imports_redis_py() -> None:
    offenders = [m for m, imps in raw_imports().items()
                 if any(i == "redis" or i.startswith("redis.") for i in imps)
                 and not m.startswith(("ringfence.redis", *APPS))]
    assert offenders == []


def test_only_fence_and_outbox_packages_import_sqlalchemy() -> None:
    # outbox/ is where SQL and Redis meet for the producer (like the worker's processor for the consumer):
    # it reaches Redis only through ringfence.redis.broker, never redis-py (checked above)
    offenders = [m for m, imps in raw_imports().items() if any(i.startswith("sqlalchemy") for i in imps)
                 and not m.startswith(("ringfence.fence", "ringfence.outbox", *APPS))]
    assert offenders == []


def test_redis_and_fence_do_not_import_each_other() -> None:
    g = graph()
    fence_to_redis = [m for m, deps in g.items() if m.startswith("ringfence.fence")
                      and any(d.startswith("ringfence.redis") for d in deps)]
    redis_to_fence = [m for m, deps in g.items() if m.startswith("ringfence.redis")
                      and any((d.startswith("ringfence.fence") and d != "ringfence.fence.model")
                              or d.startswith("ringfence.outbox") for d in deps)]
    assert fence_to_redis == [] and redis_to_fence == []


def test_errors_import_nothing_of_ours() -> None:
    assert graph()["ringfence.errors"] == frozenset()


def test_importing_the_worker_does_not_load_the_doctor() -> None:
    import subprocess
    import sys

    code = ("import sys, ringfence.worker.worker; "
            "print(sorted(m for m in sys.modules if m.startswith(('ringfence.doctor', 'ringfence.alerts'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_cli_loads_the_worker_only_for_the_worker_command() -> None:
    """Every command imports ``ringfence.cli``: the worker's pipeline is imported inside ``ringfence worker`` only."""
    import subprocess
    import sys

    code = "import sys, ringfence.cli; print(sorted(m for m in sys.modules if m.startswith('ringfence.worker')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_public_api_is_curated() -> None:
    assert sorted(ringfence.__all__) == sorted(n for n in dir(ringfence) if not n.startswith("_")
                                               and n not in {"annotations"} and not _is_module(n))


def _is_module(name: str) -> bool:
    import types

    return isinstance(getattr(ringfence, name), types.ModuleType)
