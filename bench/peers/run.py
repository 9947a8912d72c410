"""The run: venvs, repetitions in round-robin order over the libraries, the SIGKILL figure, the report."""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from types import FrameType
from typing import Any

from bench.peers import procs, report, venvs
from bench.peers.libs import BY_NAME, LIBS, ROOT, Lib
from bench.peers.measure import QUICK, Failed, Session, Sizes

FIGURES = ("enqueue", "memory", "drain", "latency", "backlog", "sigkill")
Results = dict[str, dict[str, list[Any]]]  # library -> figure key -> one value per repetition


def say(msg: str) -> None:
    print(f"[peers {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _interrupted(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def machine() -> dict[str, Any]:
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "?")
        with open("/proc/meminfo") as f:
            mem_kb = int(f.readline().split()[1])
    except (OSError, ValueError, IndexError):
        mem_kb = 0
    redis_version = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.split()
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return {"cpu": cpu, "cores": os.cpu_count(), "ram_gib": round(mem_kb / 2**20, 1),
            "redis": next((w.split("=", 1)[1] for w in redis_version if w.startswith("v=")), "?"),
            "python": platform.python_version(), "commit": commit.stdout.strip() + (" (modified)" if dirty else ""),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_start": os.getloadavg()}


def _figure(results: Results, errors: dict[str, list[str]], lib: Lib, name: str, fn: Callable[[], Any]) -> None:
    t0 = time.monotonic()
    try:
        values = fn()
    except (Failed, TimeoutError, RuntimeError, OSError) as exc:
        errors.setdefault(lib.name, []).append(f"{name}: {exc}")
        say(f"  {lib.name} {name}: FAILED: {exc}")
        return
    for key, value in values.items():
        results.setdefault(lib.name, {}).setdefault(key, []).append(value)
    say(f"  {lib.name} {name}: {report.brief(values)} ({time.monotonic() - t0:.0f} s)")


def visit(lib: Lib, figures: set[str], sizes: Sizes, log_dir: str, results: Results,
          errors: dict[str, list[str]]) -> None:
    """Every figure but SIGKILL for one library, on a private redis-server of its own."""
    try:
        session = Session(lib, sizes, log_dir)
    except (RuntimeError, OSError) as exc:
        errors.setdefault(lib.name, []).append(f"redis-server: {exc}")
        return
    try:
        if "enqueue" in figures:
            _figure(results, errors, lib, "enqueue", session.enqueue)
        if "memory" in figures:
            _figure(results, errors, lib, "memory", session.memory)
        if "drain" in figures:
            for n in (1, 2):
                _figure(results, errors, lib, f"drain {n}", _drain(session, n, f"drain_{n}"))
        if "latency" in figures:
            _figure(results, errors, lib, "latency", session.latency)
        if "backlog" in figures and sizes.backlog:
            _figure(results, errors, lib, "backlog", _drain(session, 1, "backlog", pending=sizes.backlog))
    finally:
        session.close()


def _drain(session: Session, processes: int, key: str, pending: int | None = None) -> Callable[[], dict[str, Any]]:
    def measure() -> dict[str, Any]:
        out = session.drain(processes, pending=pending)
        return {key: out["rate"], f"{key}_partial": out["partial"], f"{key}_queued": out["queued"]}

    return measure


def sigkill_all(libs: list[Lib], sizes: Sizes, log_dir: str, results: Results, errors: dict[str, list[str]]) -> None:
    """The SIGKILL figure of every library at once (each waits up to 90 s on a sleeping job, using no CPU)."""

    def one(lib: Lib) -> None:
        try:
            session = Session(lib, sizes, log_dir)
        except (RuntimeError, OSError) as exc:
            errors.setdefault(lib.name, []).append(f"sigkill: {exc}")
            return
        try:
            _figure(results, errors, lib, "sigkill", session.sigkill)
        finally:
            session.close()

    threads = [threading.Thread(target=one, args=(lib,), daemon=True) for lib in libs]
    for t in threads:
        t.start()
        time.sleep(2)  # stagger the start-ups a little on a small machine
    for t in threads:
        t.join()


def choose(args: argparse.Namespace) -> tuple[list[Lib], set[str], Sizes, int]:
    libs = [BY_NAME[n] for n in args.only.split(",")] if args.only else list(LIBS)
    sizes = QUICK if args.quick else Sizes()
    sizes = replace(sizes, backlog=args.backlog, **({"drain": args.drain} if args.drain else {}))
    if args.figures:
        figures = set(args.figures.split(","))
    else:
        figures = set(FIGURES) - {"backlog"} - ({"sigkill"} if args.quick else set())
    if args.backlog:
        figures.add("backlog")
    return libs, figures, sizes, args.reps or (1 if args.quick else 3)


def run(args: argparse.Namespace) -> int:
    if args.from_json:
        with open(args.from_json) as f:
            out = json.load(f)
        libs = [BY_NAME[n] for n in out["meta"]["libs"]]
        out["meta"].setdefault("load_end", out["meta"]["load_start"])
    else:
        libs, out = measure_all(args)
    if args.json:
        print(json.dumps(out, indent=2, default=str))
    else:
        print(report.text(out, libs))
    full = not (args.quick or args.only or args.figures)
    if args.docs if args.docs is not None else (full and not args.from_json):
        report.write_docs(out, libs)
        say("wrote docs/benchmarks.md (its peer table) and docs/img/peers-*.png")
    return 1 if out["errors"] and not out["results"] else 0


def measure_all(args: argparse.Namespace) -> tuple[list[Lib], dict[str, Any]]:
    """Every figure of every library; the results so far are saved after each step to results.json in the
    log directory (``--from-json`` renders them, e.g. of a run cut short)."""
    libs, figures, sizes, reps = choose(args)
    signal.signal(signal.SIGTERM, _interrupted)
    log_dir = tempfile.mkdtemp(prefix="peers-bench-")
    saved = os.path.join(log_dir, "results.json")
    meta = {**machine(), "reps": reps, "sizes": asdict(sizes), "figures": sorted(figures),
            "libs": [lib.name for lib in libs], "command": "python -m bench.peers " + " ".join(sys.argv[1:])}
    say(f"logs and results.json in {log_dir}; {meta['cpu']}, {meta['cores']} cores, load {meta['load_start'][0]:.2f}")
    results: Results = {}
    errors: dict[str, list[str]] = {}
    out = {"meta": meta, "results": results, "errors": errors}

    def save() -> None:
        with open(saved, "w") as f:
            json.dump(out, f, indent=1, default=str)

    ready: list[Lib] = []
    for lib in libs:
        try:
            venvs.ensure(lib.venv, say=say)
            ready.append(lib)
        except (subprocess.SubprocessError, OSError) as exc:
            errors.setdefault(lib.name, []).append(f"venv: {exc} (see bench/peers/.venvs/{lib.venv}.log)")
    meta["versions"] = {lib.name: venvs.version(lib.venv, lib.package) for lib in ready}
    try:
        if "sigkill" in figures and ready:  # first: it needs little CPU, and a cut-short run still has it
            say(f"sigkill: every library at once, up to {sizes.sigkill_wait_s:g} s each")
            sigkill_all(ready, sizes, log_dir, results, errors)
            save()
        for rep in range(reps):
            for lib in ready[rep % len(ready):] + ready[:rep % len(ready)] if ready else []:
                say(f"rep {rep + 1}/{reps}: {lib.label}")
                visit(lib, figures, sizes, log_dir, results, errors)
                meta["visits_done"] = meta.get("visits_done", 0) + 1
                save()
    finally:
        procs.kill_all()
        meta["load_end"] = os.getloadavg()
        save()
    return libs, out
