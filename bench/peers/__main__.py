"""``python -m bench.peers [--quick] [--only celery,ringfence,...] [--json]`` (``make bench-peers``), from the
repo root.

Runs in its own venv (bench/peers/.venvs/harness: redis-py, matplotlib), made on first run: started with any
python3, it re-executes itself there. Each library runs from its own venv (see libs.py).
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
HARNESS = os.path.join(HERE, ".venvs", "harness")


def _in_harness_venv() -> bool:
    return os.path.realpath(sys.prefix) == os.path.realpath(HARNESS)


def parse(argv: list[str] | None) -> argparse.Namespace:
    from bench.peers.libs import LIBS
    from bench.peers.run import FIGURES

    ap = argparse.ArgumentParser(prog="python -m bench.peers",
                                 description="ringfence beside other Redis job queues")
    ap.add_argument("--quick", action="store_true", help="small sizes, 1 repetition, no SIGKILL figure (smoke run)")
    ap.add_argument("--only", help=f"comma-separated libraries: {','.join(lib.name for lib in LIBS)}")
    ap.add_argument("--figures", help=f"comma-separated figures: {','.join(FIGURES)} (default: all but backlog; "
                                      "--quick: all but backlog and sigkill)")
    ap.add_argument("--reps", type=int, help="repetitions, round-robin over the libraries (default 3; --quick 1)")
    ap.add_argument("--drain", type=int, help="jobs per drain (default 20,000)")
    ap.add_argument("--backlog", type=int, default=0,
                    help="pending jobs of the backlog figure, e.g. 1000000 (slow: every library enqueues them)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON instead of the table")
    ap.add_argument("--from-json", metavar="FILE", help="measure nothing: report the results.json of an earlier run")
    ap.add_argument("--docs", action=argparse.BooleanOptionalAction, default=None,
                    help="write the table to docs/benchmarks.md and charts to docs/img/ "
                         "(default: on for a full run of every library and figure)")
    args = ap.parse_args(argv)
    names = {lib.name for lib in LIBS}
    if args.only and (unknown := set(args.only.split(",")) - names):
        ap.error(f"--only: unknown library {','.join(sorted(unknown))} (known: {','.join(sorted(names))})")
    if args.figures and (unknown := set(args.figures.split(",")) - set(FIGURES)):
        ap.error(f"--figures: unknown figure {','.join(sorted(unknown))} (known: {','.join(FIGURES)})")
    return args


def main(argv: list[str] | None = None) -> int:
    root = os.path.dirname(os.path.dirname(HERE))
    if root not in sys.path:
        sys.path.insert(0, root)
    if not _in_harness_venv():
        from bench.peers import venvs

        parse(argv)  # --help and bad flags answer before any venv is made
        venvs.ensure("harness", say=lambda m: print(f"[peers] {m}", file=sys.stderr, flush=True))
        python = os.path.join(HARNESS, "bin", "python")
        env = {**os.environ, "PYTHONPATH": root}
        os.chdir(root)
        os.execve(python, [python, "-m", "bench.peers", *(sys.argv[1:] if argv is None else argv)], env)
    from bench.peers.run import run

    return run(parse(argv))


if __name__ == "__main__":
    sys.exit(main())
