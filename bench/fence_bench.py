"""The ``fence`` figure of ``python -m bench --only fence``: fenced no-op effects on PostgreSQL or MariaDB.

A fenced job opens ``ctx.fence(subject, "noop", params=...)``, runs ``step.effect`` with a no-op effect and
completes with ``step.complete(engine)`` writing nothing else: the whole cost is the fence's. Figures:

- jobs/s of ``sizes.fence`` fenced jobs drained by 1 and 2 real worker processes, ``sync def`` (thread pool)
  and ``async def`` handlers, each against the same number of plain no-op jobs of the same kind, drains
  interleaved (plain, fenced, plain, fenced, ...) so drift of the shared machine hits both;
- the cost per job: wall ms (1000/fenced - 1000/plain jobs/s per process) and worker CPU ms per job;
- the database round trips of one fenced job, counted on the wire (PostgreSQL: libpq trace, one
  ``ReadyForQuery`` per round trip; MariaDB: PyMySQL's commands, each one request and its answer), the
  transactions as the server counts them, the statements, and the in-process latency of one fenced job alone.

The fence table lives in a private database ``ringfence_bench_<hex>`` created on the server of
``--fence-url`` (``postgresql+psycopg://…`` or ``mysql+pymysql://…``; default ``$RINGFENCE_BENCH_FENCE_URL``,
else the test suite's database ``test`` on
``127.0.0.1:5432`` as libpq's default user: ``$PGUSER`` or the login name)
and dropped at the end, so a shared server keeps nothing of the run. Subjects are ``bench-<hex>:order:<n>``.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Engine, make_url

from ringfence.app import App
from ringfence.redis.broker import Broker
from ringfence.tasks import JobContext, Task
from ringfence.worker.fencing import Fencing


class FenceSizes(Protocol):  # read-only: the bench's Sizes is a frozen dataclass
    @property
    def batch(self) -> int: ...
    @property
    def fence(self) -> int: ...
    @property
    def fence_reps(self) -> int: ...
    @property
    def fence_alone(self) -> int: ...


class Bench(Protocol):
    """What the fence figure needs of ``bench.ringfence_bench.Bench`` (a protocol: no import cycle)."""

    app: App
    broker: Broker
    results: dict[str, Any]
    worker_env: dict[str, str]
    last_drain_cpu_s: float
    last_drain_jobs: int
    last_drain_busy_cores: float

    @property
    def sizes(self) -> FenceSizes: ...
    def build_app(self, fence_url: str | None = None) -> App: ...
    def reset(self) -> None: ...
    def task(self, name: str) -> Task: ...
    def timed_drain(self, n_workers: int, jobs: int, queue: str = ...) -> float: ...

DEFAULT_FENCE_URL = "postgresql+psycopg://127.0.0.1:5432/test"  # no user: libpq takes $PGUSER or the login
STEP = "noop"


# -- the handlers (registered by bench.ringfence_bench.build_app) --------------------------------------------
def _engine(ctx: JobContext) -> Engine:
    """The fence store's own engine: the fence table lives in the database the job writes to."""
    fencing = ctx.fencing
    assert isinstance(fencing, Fencing), "runs in a worker"
    engine: Engine = fencing.stores.fence_store.engine
    return engine


def fenced_sync(ctx: JobContext, run: str, n: int) -> None:
    """A fenced no-op effect, ``sync def`` (runs in the worker's thread pool)."""
    with ctx.fence(f"{run}:order:{n}", STEP, params={"n": n}) as step:
        if step.done:
            return
        step.effect(lambda: f"noop-{n}")
        with step.complete(_engine(ctx)):
            pass  # no local writes: the completion UPDATE alone


async def fenced_async(ctx: JobContext, run: str, n: int) -> None:
    """The same, ``async def``: the store calls run in a thread (``offloop.py``: calling, the sync effect and the
    record in one hop); ``complete`` with a sync Engine runs its begin and commit in a thread (docs/fences.md)."""
    async with ctx.fence(f"{run}:order:{n}", STEP, params={"n": n}) as step:
        if step.done:
            return
        await step.effect(lambda: f"noop-{n}")
        async with step.complete(_engine(ctx)):
            pass


def fenced_sync_dedup(ctx: JobContext, run: str, n: int) -> None:
    """``fenced_sync`` for a provider that deduplicates by the key (``provider_dedup=True``): the step is captured
    already ``calling`` (one statement less; docs/fences.md)."""
    with ctx.fence(f"{run}:order:{n}", STEP, params={"n": n}, provider_dedup=True, key_window_s=3600) as step:
        if step.done:
            return
        step.effect(lambda: f"noop-{n}")
        with step.complete(_engine(ctx)):
            pass


async def fenced_async_dedup(ctx: JobContext, run: str, n: int) -> None:
    """``fenced_async`` with ``provider_dedup=True``."""
    async with ctx.fence(f"{run}:order:{n}", STEP, params={"n": n}, provider_dedup=True, key_window_s=3600) as step:
        if step.done:
            return
        await step.effect(lambda: f"noop-{n}")
        async with step.complete(_engine(ctx)):
            pass


def noop_sync(ctx: JobContext, run: str, n: int) -> None:
    """The plain ``sync def`` no-op the sync fenced drain is compared with (same payload)."""


async def noop_async(ctx: JobContext, run: str, n: int) -> None:
    """The plain ``async def`` no-op the async fenced drain is compared with (same payload)."""


KINDS = {  # kind -> (fenced task, plain task)
    "sync": ("bench.fenced_sync", "bench.noop_sync"),
    "async": ("bench.fenced_async", "bench.noop_async"),
}
# Counted in-process only (round trips, transactions, latency alone), not drained.
DEDUP_KINDS = {"sync_dedup": fenced_sync_dedup, "async_dedup": fenced_async_dedup}


# -- a private database ----------------------------------------------------------------------------------
@contextmanager
def private_database(base_url: str) -> Iterator[str]:
    """CREATE DATABASE ringfence_bench_<hex> on ``base_url``'s server; yield its URL; DROP it at the end."""
    base = make_url(base_url)
    pg = base.get_backend_name() == "postgresql"
    if not pg and base.get_backend_name() not in ("mysql", "mariadb"):
        raise SystemExit(f"--fence-url: the fence figure needs PostgreSQL or MariaDB, got {base.get_backend_name()}")
    name = f"ringfence_bench_{uuid.uuid4().hex[:10]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    quoted = f'"{name}"' if pg else f"`{name}`"
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE {quoted}")
        try:
            yield base.set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.connect() as conn:
                conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {quoted}" + (" WITH (FORCE)" if pg else ""))
    finally:
        admin.dispose()


# -- counting round trips on the wire --------------------------------------------------------------------
@contextmanager
def wire_trace(engine: Any, *more: Any) -> Iterator[list[str]]:
    """One line per database round trip made through ``engine`` (and ``more`` of the same server: another engine,
    e.g. the sync engine of the store's AsyncEngine, or the driver connections a store keeps, its ``direct``)
    inside the block (PostgreSQL or MariaDB). ``store_targets(store)`` names all of a store's."""
    if engine.dialect.name == "postgresql":
        with pg_wire_trace(engine, *more) as trips:
            yield trips
    else:
        with mysql_wire_trace() as trips:
            yield trips


def store_targets(store: Any) -> list[Any]:
    """Everything a FenceStore sends statements through: its engine, its kept driver connections (sync and, once
    an async fence opened them, async)."""
    astore = getattr(store, "_astore", None)
    more = [store.direct, astore and getattr(astore, "direct", None), astore and getattr(astore, "engine", None)]
    return [store.engine] + [getattr(m, "sync_engine", m) for m in more if m is not None]


@contextmanager
def mysql_wire_trace() -> Iterator[list[str]]:
    """PyMySQL's commands to the server inside the block: each is one request and its answer (a round trip).
    A statement's line is its label; COMMIT / ROLLBACK end a transaction (MySQL drivers send no BEGIN)."""
    from pymysql.connections import Connection

    trips: list[str] = []
    real = Connection._execute_command

    def counted(self: Any, command: int, sql: Any) -> Any:
        text_ = sql.decode(errors="replace") if isinstance(sql, bytes) else str(sql)
        label = _statement(text_) if command == 3 else f"(command {command})"  # 3: COM_QUERY
        # A statement on an autocommit connection outside a transaction is a transaction of its own (no " …").
        alone = bool(getattr(self, "autocommit_mode", False)) and not (self.server_status & 1)  # SERVER_STATUS_IN_TRANS
        trips.append(label if label in ("COMMIT", "ROLLBACK") or alone else label + " …")
        return real(self, command, sql)

    Connection._execute_command = counted
    try:
        yield trips
    finally:
        Connection._execute_command = real


@contextmanager
def pg_wire_trace(engine: Any, *more: Any) -> Iterator[list[str]]:
    """libpq's protocol trace of every connection checked out of ``engine`` (and ``more``: engines, or kept
    driver connections, ``kept_connections.Direct``, traced while a statement has one) inside the block.

    Yields a list filled at exit with one line per round trip: the statement(s) the client sent before
    the server's ``ReadyForQuery``. Needs psycopg 3 (``pgconn.trace``)."""
    from psycopg import pq

    fd, path = tempfile.mkstemp(prefix="ringfence-bench-pgtrace-")
    trips: list[str] = []

    def checkout(dbapi_conn: Any, record: Any = None, proxy: Any = None) -> None:
        pgconn = getattr(dbapi_conn, "driver_connection", dbapi_conn).pgconn  # an async adapter's own connection
        pgconn.trace(fd)
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)

    def checkin(dbapi_conn: Any, record: Any = None) -> None:
        if dbapi_conn is not None:
            getattr(dbapi_conn, "driver_connection", dbapi_conn).pgconn.untrace()

    engines = [e for e in (engine, *more) if isinstance(e, Engine)]
    kept = [d for d in (engine, *more) if not isinstance(d, Engine)]
    for e in engines:
        event.listen(e, "checkout", checkout)
        event.listen(e, "checkin", checkin)
    for d in kept:
        d.on_take.append(checkout)
        d.on_give.append(checkin)
    try:
        yield trips
    finally:
        for e in engines:
            event.remove(e, "checkout", checkout)
            event.remove(e, "checkin", checkin)
        for d in kept:
            d.on_take.remove(checkout)
            d.on_give.remove(checkin)
        os.close(fd)
        with open(path, encoding="utf-8", errors="replace") as f:
            sent: list[str] = []
            for line in f:
                parts = line.rstrip("\n").split("\t")
                if len(parts) < 4:
                    continue
                direction, kind, body = parts[0], parts[2], parts[3].strip()
                if direction == "F" and kind in ("Query", "Parse"):
                    sent.append(_statement(body))
                elif direction == "B" and kind == "ReadyForQuery":
                    # no Query/Parse: a statement prepared earlier on this connection (Bind/Execute only)
                    trips.append((" + ".join(sent) or "(prepared)") + ("" if body.strip() == "I" else " …"))
                    sent = []
        os.unlink(path)


def _statement(body: str) -> str:
    """A short label for a traced statement: its verb, and for an UPDATE the columns it sets."""
    named = re.match(r'"[\w]*" "', body)  # Parse: "<statement name, or none>" "<sql>" ...; a multi-line SQL is cut
    if named:
        body = body[named.end() - 1:]
    sql = body.lstrip('"').split('"', 1)[0]
    words = sql.split()
    verb = words[0].upper() if words else "?"
    if verb == "UPDATE":
        sets = re.split(r"\bWHERE\b", re.split(r"\bSET\b", sql, maxsplit=1)[-1], maxsplit=1)[0]
        cols = [c for c in re.findall(r"(\w+)\s*=(?!>)", sets) if c != "updated_at"]
        return f"UPDATE({','.join(cols)})"
    return verb


def summarize(trips: list[str]) -> str:
    """``BEGIN, INSERT, COMMIT, ...`` as ``[INSERT] [SELECT] ...``: one bracket per transaction.

    On PostgreSQL a line ending in `` …`` left the server inside a transaction; one without it and without
    BEGIN around it ran in autocommit: a transaction of its own, shown as ``[X]a``."""
    out: list[str] = []
    cur: list[str] = []
    for t in trips:
        open_ = t.endswith(" …")
        t = t.removesuffix(" …")
        if t == "BEGIN":
            cur = []
        elif t in ("COMMIT", "ROLLBACK"):
            out.append(f"[{' '.join(cur)}]{'' if t == 'COMMIT' else 'r'}")
            cur = []
        elif cur or open_:
            cur.append(t)
        else:
            out.append(f"[{t}]a")
    if cur:
        out.append(" ".join(cur))
    return " ".join(out)


def transactions(trips: list[str]) -> int:
    """Transactions as the server counts them: each COMMIT/ROLLBACK of a statement ends one, each autocommit
    statement is one (a ROLLBACK of nothing is a round trip, not a transaction)."""
    s = summarize(trips)
    return s.count("[") - s.count("[]")


def machine_busy_s() -> float:
    """CPU seconds the whole machine spent busy so far (all cores; /proc/stat)."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return float("nan")
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


# -- the figure ------------------------------------------------------------------------------------------
def proc_cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of these processes so far (Linux /proc)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15 of stat)
        except (OSError, IndexError, ValueError):
            return float("nan")
    return total / os.sysconf("SC_CLK_TCK")


_LOOP: list[asyncio.AbstractEventLoop] = []


def _loop() -> asyncio.AbstractEventLoop:
    if not _LOOP:
        _LOOP.append(asyncio.new_event_loop())
    return _LOOP[0]


def _run_jobs(task: Any, fencing: Any, run: str, ns: range) -> list[float]:
    """Run jobs ``ns`` of ``task`` one after another in this process (one event loop for async handlers);
    returns each job's ms."""

    def ctx_for() -> JobContext:
        token = f"bench-{uuid.uuid4().hex}"
        fencing.live.add(token)  # this attempt is alive while it runs (TestFencing's liveness probe)
        return JobContext(id=uuid.uuid4().hex, task=task.name, queue=task.options.queue, attempt=1,
                          max_attempts=task.options.retry.max_attempts, enqueued_ms=int(time.time() * 1000),
                          token=token, timeout_s=task.options.timeout_s, fencing=fencing)

    async def all_async() -> list[float]:
        times = []
        for n in ns:
            ctx = ctx_for()
            t0 = time.perf_counter()
            await task.fn(ctx, run=run, n=n)
            times.append((time.perf_counter() - t0) * 1000)
            fencing.live.discard(ctx.token)
        return times

    if task.is_async:  # one loop for the whole bench: the store's AsyncEngine is bound to the first loop
        return _loop().run_until_complete(all_async())
    times = []
    for n in ns:
        ctx = ctx_for()
        t0 = time.perf_counter()
        task.fn(ctx, run=run, n=n)
        times.append((time.perf_counter() - t0) * 1000)
        fencing.live.discard(ctx.token)
    return times


def in_process(bench: Bench, fence_url: str, prefix: str, jobs: int) -> dict[str, Any]:
    """Round trips of one fenced job (on the wire) and the latency of one fenced job run alone, with the
    worker's fence wiring in-process (``ringfence.testing.TestFencing``)."""
    from ringfence.testing import TestFencing

    app = bench.build_app(fence_url)
    queue = app.registry.get(KINDS["sync"][0]).options.queue  # type: ignore[union-attr]
    names = {kind: fenced for kind, (fenced, _) in KINDS.items()}
    for kind, fn in DEDUP_KINDS.items():
        names[kind] = f"bench.{fn.__name__}"
        if app.registry.get(names[kind]) is None:
            app.task(name=names[kind], queue=queue)(fn)
    fencing = TestFencing(app)
    engine = app.fence_store.engine
    out: dict[str, Any] = {}
    try:
        for kind, fenced_name in names.items():
            task = app.registry.get(fenced_name)
            assert task is not None
            run = f"{prefix}-inproc-{kind}"
            _run_jobs(task, fencing, run, range(-3, 0))  # connect, warm the pool and the statement caches
            with wire_trace(*store_targets(app.fence_store)) as trips:
                _run_jobs(task, fencing, run, range(0, 1))
            out[f"fence_{kind}_round_trips"] = len(trips)
            out[f"fence_{kind}_xacts"] = transactions(trips)
            out[f"fence_{kind}_trips"] = trips
            out[f"fence_{kind}_transactions"] = summarize(trips)
            # a second job on the same subject: the fence is done
            with wire_trace(*store_targets(app.fence_store)) as again:
                _run_jobs(task, fencing, run, range(0, 1))
            out[f"fence_{kind}_rerun_round_trips"] = len(again)
            out[f"fence_{kind}_rerun_xacts"] = transactions(again)
            out[f"fence_{kind}_rerun_trips"] = again
            out[f"fence_{kind}_rerun_transactions"] = summarize(again)
            out[f"fence_{kind}_alone_ms"] = statistics.median(_run_jobs(task, fencing, run, range(1, jobs + 1)))
        with engine.connect() as conn:  # what one round trip costs here
            rtts = []
            for _ in range(200):
                t0 = time.perf_counter()
                conn.exec_driver_sql("SELECT 1")
                rtts.append((time.perf_counter() - t0) * 1000)
            out["db_round_trip_ms"] = statistics.median(rtts)
            if engine.dialect.name == "postgresql":
                out["pg_settings"] = {k: conn.exec_driver_sql(f"SHOW {k}").scalar() for k in
                                      ("server_version", "synchronous_commit", "fsync")}
            else:
                out["db_version"] = conn.exec_driver_sql("SELECT VERSION()").scalar()
    finally:
        engine.dispose()
        if app.fence_store._astore is not None:
            _loop().run_until_complete(app.fence_store._astore.aclose())
        app.close()
    return out


def enqueue_fence_jobs(bench: Bench, task_name: str, run: str, n: int) -> None:
    task, batch = bench.task(task_name), bench.sizes.batch
    for start in range(0, n, batch):
        bench.app.enqueue_many(task, [{"run": run, "n": i} for i in range(start, min(n, start + batch))])


def drain(bench: Bench, task_name: str, run: str, workers: int) -> tuple[float, float, float]:
    """Fill the paused queue with ``sizes.fence`` jobs of ``task_name`` and drain them.
    Returns (jobs/s, worker CPU ms per job, busy cores of the whole machine during the drain)."""
    n, queue = bench.sizes.fence, bench.task(task_name).options.queue
    bench.broker.set_paused(queue, True)
    enqueue_fence_jobs(bench, task_name, run, n)
    rate = bench.timed_drain(workers, n + 1, queue)
    return rate, bench.last_drain_cpu_s * 1000 / max(1, bench.last_drain_jobs), bench.last_drain_busy_cores


def _completed(store: Any, run: str) -> int:
    """Completed fences of one drain (every fenced job must leave exactly one)."""
    with store.engine.connect() as conn:
        q = text(f"SELECT count(*) FROM {store.table.name} WHERE state = 'completed' AND subject LIKE :p")
        return int(conn.execute(q, {"p": f"{run}:order:%"}).scalar_one())


def say(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def fig_fence(bench: Bench, base_url: str) -> None:
    s, r = bench.sizes, bench.results
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    with private_database(base_url) as url:
        from ringfence.fence import FenceStore

        store = FenceStore(url)
        store.create_all()
        say(f"  private database {make_url(url).database}; subjects {prefix}-*:order:<n>")
        r.update(in_process(bench, url, prefix, s.fence_alone))
        for kind in (*KINDS, *DEDUP_KINDS):
            say(f"  one {kind} fenced job: {r[f'fence_{kind}_round_trips']} round trips, "
                f"{r[f'fence_{kind}_xacts']} transactions ({r[f'fence_{kind}_transactions']}); rerun "
                f"{r[f'fence_{kind}_rerun_round_trips']} round trip(s); {r[f'fence_{kind}_alone_ms']:.2f} ms alone")
        bench.reset()
        bench.worker_env = {"RINGFENCE_FENCE_URL": url}
        try:
            for kind, (fenced_name, plain_name) in KINDS.items():
                for workers in (1, 2):
                    fenced, plain, fcpu, pcpu, busy = [], [], [], [], []
                    for rep in range(s.fence_reps):
                        rate, cpu, _ = drain(bench, plain_name, f"{prefix}-p{kind}{workers}{rep}", workers)
                        plain.append(rate)
                        pcpu.append(cpu)
                        run = f"{prefix}-{kind}{workers}{rep}"
                        rate, cpu, cores = drain(bench, fenced_name, run, workers)
                        done = _completed(store, run)
                        if done != s.fence:
                            say(f"  !! {run}: {done} fences completed, expected {s.fence}")
                            r.setdefault("fence_incomplete", []).append({"run": run, "completed": done})
                        fenced.append(rate)
                        fcpu.append(cpu)
                        busy.append(cores)
                        say(f"  {kind}, {workers} process(es): fenced {fenced[-1]:,.0f} jobs/s "
                            f"(worker CPU {fcpu[-1]:.2f} ms/job, machine {cores:.2f} cores busy), "
                            f"plain {plain[-1]:,.0f} jobs/s ({pcpu[-1]:.3f} ms/job)")
                    key = f"fence_{kind}_{workers}"
                    f_med, p_med = statistics.median(fenced), statistics.median(plain)
                    r.update({
                        f"{key}_jobs_s": f_med, f"{key}_plain_jobs_s": p_med,
                        f"{key}_runs": [round(x) for x in fenced], f"{key}_plain_runs": [round(x) for x in plain],
                        # wall time one process spends per job, fenced minus plain
                        f"{key}_cost_ms": (1000 / f_med - 1000 / p_med) * workers,
                        f"{key}_cpu_ms": statistics.median(fcpu), f"{key}_plain_cpu_ms": statistics.median(pcpu),
                        f"{key}_busy_cores": statistics.median(busy),
                    })
        finally:
            bench.worker_env = {}
            store.engine.dispose()
    r["fence_jobs"] = s.fence


# -- CPU per fenced job, in-process ----------------------------------------------------------------------------
def cpu_per_job(base_url: str, jobs: int, kinds: list[str]) -> dict[str, float]:
    """ms of process CPU (``time.process_time``, threads included) per fenced job of each kind (sync, async,
    sync_dedup, async_dedup), ``jobs`` run one after another in-process with the worker's fence wiring
    (``ringfence.testing.TestFencing``) after 20 warm-up jobs, on a private database of ``base_url``'s server;
    ``<kind>_db``: the CPU of that database's server processes (PostgreSQL backends on this machine) per job;
    ``<kind>_wall``: the median wall ms of one job (its four commits in a row)."""
    from bench.ringfence_bench import build_app
    from ringfence.fence import FenceStore
    from ringfence.testing import TestFencing

    names = {kind: fenced for kind, (fenced, _) in KINDS.items()}
    names.update({kind: f"bench.{fn.__name__}" for kind, fn in DEDUP_KINDS.items()})
    out: dict[str, float] = {}
    with private_database(base_url) as url:
        store = FenceStore(url)
        store.create_all()
        store.engine.dispose()
        app = build_app(fence_url=url)
        for kind, fn in DEDUP_KINDS.items():
            app.task(name=names[kind], queue="bench")(fn)
        fencing, run = TestFencing(app), f"cpu-{uuid.uuid4().hex[:8]}"
        try:
            for kind in kinds:
                task = app.registry.get(names[kind])
                _run_jobs(task, fencing, f"{run}-{kind}", range(-20, 0))
                pids = _backends(url)
                db0, t0 = proc_cpu_s(pids), time.process_time()
                walls = _run_jobs(task, fencing, f"{run}-{kind}", range(jobs))
                out[kind] = (time.process_time() - t0) * 1000 / jobs
                out[f"{kind}_wall"] = statistics.median(walls)
                out[f"{kind}_db"] = (proc_cpu_s(pids) - db0) * 1000 / jobs if pids else float("nan")
        finally:
            app.fence_store.engine.dispose()
            if app.fence_store._astore is not None:
                _loop().run_until_complete(app.fence_store._astore.aclose())
            app.close()
    return out


def _backends(url: str) -> list[int]:
    """The server processes of ``url``'s database (PostgreSQL; [] elsewhere: no figure)."""
    u = make_url(url)
    if u.get_backend_name() != "postgresql":
        return []
    engine = create_engine(u.set(database="postgres"))
    try:
        with engine.connect() as conn:
            q = text("SELECT pid FROM pg_stat_activity WHERE datname = :d")
            return [int(pid) for pid in conn.execute(q, {"d": u.database}).scalars()]
    finally:
        engine.dispose()


if __name__ == "__main__":  # python -m bench.fence_bench URL [JOBS] [KINDS]
    args = sys.argv[1:] or [DEFAULT_FENCE_URL]
    kinds = (args[2] if len(args) > 2 else "sync,async,sync_dedup,async_dedup").split(",")
    cpu = cpu_per_job(args[0], int(args[1]) if len(args) > 1 else 500, kinds)
    db = {k: "" if math.isnan(cpu[k + "_db"]) else f" (PostgreSQL backends {cpu[k + '_db']:.3f})" for k in kinds}
    print(f"load {os.getloadavg()[0]:.2f}; " + "; ".join(
        f"{k}: {cpu[k]:.3f} ms CPU/job{db[k]}, median {cpu[k + '_wall']:.3f} ms wall/job" for k in kinds))
