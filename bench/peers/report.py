"""The peer benchmark's table (text and Markdown), ringfence's speed targets as ratios, PNG charts, and the
generated part of docs/benchmarks.md (between the ``peers:begin``/``peers:end`` markers)."""

from __future__ import annotations

import math
import os
import re
import statistics
from typing import Any

from bench.peers.libs import ROOT, Lib

COLUMNS = (  # key, header, number format
    ("enqueue_single", "single enqueue, jobs/s", "{:,.0f}"),
    ("enqueue_bulk", "bulk enqueue, jobs/s", "{:,.0f}"),
    ("drain_1", "drain, 1 process, jobs/s", "{:,.0f}"),
    ("drain_2", "drain, 2 processes, jobs/s", "{:,.0f}"),
    ("latency_p50", "enqueue-to-start p50, ms", "{:,.1f}"),
    ("latency_p99", "p99, ms", "{:,.1f}"),
    ("bytes_per_job", "Redis B/queued job", "{:,.0f}"),
    ("backlog", "drain, backlog pending, jobs/s", "{:,.0f}"),
    ("sigkill_s", "SIGKILL mid-job", "{:.1f} s"),
)
HIGHER_IS_BETTER = {"enqueue_single", "enqueue_bulk", "drain_1", "drain_2", "backlog"}
SYNC_PEERS, ASYNC_PEERS = ("dramatiq", "huey", "celery"), ("saq", "taskiq", "arq")


def _finite(values: list[Any]) -> list[float]:
    return [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]


def med(results: dict[str, Any], lib: str, key: str) -> float | None:
    vals = _finite(results.get(lib, {}).get(key, []))
    return statistics.median(vals) if vals else None


def cell(results: dict[str, Any], lib: str, key: str, fmt: str, drain_n: int = 0) -> str:
    raw = results.get(lib, {}).get(key)
    if raw is None:
        return "–"
    if key == "sigkill_s":
        return "lost (not re-run within 90 s)" if raw[0] is None else "re-run after " + fmt.format(raw[0])
    vals = _finite(raw)
    if not vals:
        return "not every job started" if key.startswith("latency") else "–"
    text = fmt.format(statistics.median(vals))
    if len(vals) > 1:
        text += f" ({fmt.format(min(vals))}–{fmt.format(max(vals))})"
    if any(results[lib].get(f"{key}_partial", [])):
        text += " *"
    queued = results[lib].get(f"{key}_queued", [])
    if key.startswith("drain") and queued and min(queued) < drain_n:
        text += f" (of {min(queued):,}–{max(queued):,} queued)"
    if key.startswith("latency") and len(vals) < len(raw):
        text += f" ({len(raw) - len(vals)} of {len(raw)} runs: > 1 % of the jobs never started)"
    return text


def brief(values: dict[str, Any]) -> str:
    parts = []
    for k, v in values.items():
        if isinstance(v, float) and not k.endswith("partial"):
            parts.append(f"{k}={v:,.1f}")
        elif v is None or (isinstance(v, bool) and v):
            parts.append(f"{k}={v}")
    return ", ".join(parts)


def _columns(results: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [c for c in COLUMNS if any(c[0] in r for r in results.values())]


def table_rows(out: dict[str, Any], libs: list[Lib]) -> tuple[list[str], list[list[str]]]:
    results, versions = out["results"], out["meta"].get("versions", {})
    cols = _columns(results)
    header = ["library", *[c[1] for c in cols]]
    rows = []
    for lib in libs:
        name = f"{lib.label} {versions.get(lib.name, '')}".strip()
        if lib.name not in results:
            rows.append([name, *["failed" for _ in cols]])
            continue
        drain_n = out["meta"]["sizes"]["drain"]
        rows.append([name, *[cell(results, lib.name, k, fmt, drain_n) for k, _, fmt in cols]])
    return header, rows


def targets(out: dict[str, Any]) -> list[tuple[str, str, str]]:
    """ringfence's speed targets as ratios in this run: (target, figures, PASS/MISS/–)."""
    r = out["results"]
    found: list[tuple[str, str, str]] = []

    def best(peers: tuple[str, ...] | list[str], key: str, high: bool) -> tuple[str | None, float | None]:
        vals = [(p, v) for p in peers if (v := med(r, p, key)) is not None]
        if not vals:
            return None, None
        return (max if high else min)(vals, key=lambda pv: pv[1])

    for kind, lib, peers in (("sync", "ringfence", SYNC_PEERS), ("async", "ringfence-async", ASYNC_PEERS)):
        for key, what in (("drain_1", "1 process"), ("drain_2", "2 processes")):
            mine, (peer, theirs) = med(r, lib, key), best(peers, key, True)
            if mine is not None and theirs:
                ratio = mine / theirs
                found.append((f"drain per process, {kind}, {what}: ≥ 2.7× the fastest of {'/'.join(peers)}",
                              f"{mine:,.0f} vs {peer} {theirs:,.0f} = {ratio:.2f}×", _ok(ratio >= 2.7)))
    others = [p for p in r if not p.startswith("ringfence")]
    mine, (peer, theirs) = med(r, "ringfence", "enqueue_single"), best(others, "enqueue_single", True)
    if mine is not None and theirs:
        found.append(("single enqueue ≥ 1.5× the fastest peer", f"{mine:,.0f} vs {peer} {theirs:,.0f} = "
                      f"{mine / theirs:.2f}×", _ok(mine / theirs >= 1.5)))
    for lib in ("ringfence", "ringfence-async"):
        mine, (peer, theirs) = med(r, lib, "latency_p99"), best(others, "latency_p99", False)
        if mine is not None and theirs is not None:
            found.append((f"p99 enqueue-to-start below every peer's ({lib})",
                          f"{mine:.1f} ms vs {peer} {theirs:.1f} ms", _ok(mine < theirs)))
    mine, huey = med(r, "ringfence", "bytes_per_job"), med(r, "huey", "bytes_per_job")
    if mine is not None and huey is not None:
        found.append(("Redis bytes per queued job ≤ Huey's", f"{mine:,.0f} B vs {huey:,.0f} B", _ok(mine <= huey)))
    for lib in ("ringfence", "ringfence-async"):
        full, empty = med(r, lib, "backlog"), med(r, lib, "drain_1")
        if full is not None and empty:
            found.append((f"drain with the backlog pending within 10 % of empty ({lib})",
                          f"{full:,.0f} vs {empty:,.0f} jobs/s = {full / empty:.2f}", _ok(full / empty >= 0.9)))
    return found


def _ok(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def header_lines(out: dict[str, Any]) -> list[str]:
    m = out["meta"]
    s = m["sizes"]
    return [
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['ram_gib']} GiB RAM; Redis {m['redis']}; Python {m['python']}; "
        f"load average {m['load_start'][0]:.2f} at the start, {m.get('load_end', [float('nan')])[0]:.2f} at the end.",
        f"Commit `{m['commit']}`, {m['date']}; `{m['command'].strip()}`; medians of {m['reps']} "
        f"(min–max), libraries in round-robin order; drains of {s['drain']:,} jobs"
        + (f", backlog {s['backlog']:,} pending" if s["backlog"] else "") + ".",
        *_cut_short(m),
        *(["The machine was shared: other work ran beside this run (load average above the core count), so "
           "single figures spread; compare the libraries within this run, not with other runs."]
          if max(m["load_start"][0], m.get("load_end", [0.0])[0]) > m["cores"] else []),
    ]


def _cut_short(m: dict[str, Any]) -> list[str]:
    planned = m["reps"] * len(m.get("libs", []))
    done = m.get("visits_done", planned)
    if done >= planned:
        return []
    return [f"Cut short: {done} of {planned} library visits done; medians of what was measured."]


def text(out: dict[str, Any], libs: list[Lib]) -> str:
    header, rows = table_rows(out, libs)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [*header_lines(out), ""]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [header, *rows]]
    if any(c.endswith("*") for r in rows for c in r):
        lines.append("* a drain that did not finish in time: the rate of the jobs done by then")
    found = targets(out)
    if found:
        lines += ["", "targets:"] + [f"  {st:<4} {t}: {fig}" for t, fig, st in found]
    for lib, errs in out["errors"].items():
        lines += [f"FAILED {lib}: {e}" for e in errs]
    return "\n".join(lines)


def markdown(out: dict[str, Any], libs: list[Lib], charts: list[str]) -> str:
    header, rows = table_rows(out, libs)
    lines = [line for h in header_lines(out) for line in (h, "")]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    if any(c.endswith("*") for r in rows for c in r):
        lines += ["", "\\* the drain did not finish within the time limit: the rate of the jobs done by then."]
    found = targets(out)
    if found:
        lines += ["", "Targets, as ratios in this run:", "", "| target | this run | |", "|---|---|---|"]
        lines += [f"| {t} | {fig} | {st} |" for t, fig, st in found]
    errs = [f"- {lib}: {e}" for lib, es in out["errors"].items() for e in es]
    if errs:
        lines += ["", "Failures in this run:", "", *errs]
    if charts:
        lines += ["", *[f"![{os.path.basename(c)}]({c})" for c in charts]]
    return "\n".join(lines)


def charts(out: dict[str, Any], libs: list[Lib], directory: str) -> list[str]:
    """Bar charts (median, min–max as error bars); returns their paths relative to docs/."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r = out["results"]
    groups = (("peers-enqueue.png", "Enqueue (jobs/s, log scale)", ("enqueue_single", "enqueue_bulk"), True),
              ("peers-drain.png", "Drain of queued jobs (jobs/s)", ("drain_1", "drain_2"), False),
              ("peers-latency.png", "Enqueue-to-start at 200 jobs/s (ms, log scale)",
               ("latency_p50", "latency_p99"), True),
              ("peers-memory.png", "Redis bytes per queued job", ("bytes_per_job",), False))
    labels = {k: h for k, h, _ in COLUMNS}
    names = [lib for lib in libs if lib.name in r]
    paths = []
    os.makedirs(directory, exist_ok=True)
    for fname, title, keys, log in groups:
        if not any(k in r.get(lib.name, {}) for lib in names for k in keys):
            continue
        fig, ax = plt.subplots(figsize=(10, 4.2))
        width = 0.8 / len(keys)
        for i, key in enumerate(keys):
            meds, lo, hi = [], [], []
            for lib in names:
                vals = _finite(r[lib.name].get(key, []))
                m = statistics.median(vals) if vals else 0.0
                meds.append(m)
                lo.append(m - min(vals) if vals else 0.0)
                hi.append(max(vals) - m if vals else 0.0)
            xs = [x + (i - (len(keys) - 1) / 2) * width for x in range(len(names))]
            ax.bar(xs, meds, width, yerr=[lo, hi], capsize=3, label=labels[key])
        ax.set_xticks(range(len(names)), [lib.label for lib in names], rotation=20, ha="right")
        ax.set_title(title)
        if log:
            ax.set_yscale("log")
        ax.legend()
        ax.grid(axis="y", alpha=0.3)
        fig.tight_layout()
        path = os.path.join(directory, fname)
        fig.savefig(path, dpi=90)
        plt.close(fig)
        paths.append(os.path.relpath(path, os.path.join(ROOT, "docs")))
    return paths


BEGIN, END = "<!-- peers:begin (written by python -m bench.peers) -->", "<!-- peers:end -->"


def write_docs(out: dict[str, Any], libs: list[Lib]) -> None:
    docs = os.path.join(ROOT, "docs")
    body = markdown(out, libs, charts(out, libs, os.path.join(docs, "img")))
    path = os.path.join(docs, "benchmarks.md")
    with open(path, encoding="utf-8") as f:
        text_ = f.read()
    block = f"{BEGIN}\n{body}\n{END}"
    if BEGIN in text_ and END in text_:
        text_ = re.sub(re.escape(BEGIN) + r".*?" + re.escape(END), lambda _: block, text_, flags=re.S)
    else:
        text_ = text_.rstrip("\n") + "\n\n" + block + "\n"
    with open(path, "w", encoding="utf-8") as f:
        f.write(text_)
