"""ringfence in a Django project: settings, the tables as migrations, ``manage.py ringfence``, the admin.

``settings.py``::

    INSTALLED_APPS = [..., "ringfence.contrib.django"]
    RINGFENCE = {
        "APP": "shop.jobs:app",          # where your App lives (manage.py ringfence, the admin)
        "REDIS_URL": "redis://127.0.0.1:6379/0",
        "NAMESPACE": "shop",
        "ENVIRONMENT": "production",
        "DATABASE": "default",           # the Django database that holds the fence tables
    }

``shop/jobs.py``::

    from ringfence.contrib.django import make_app

    app = make_app()                     # App(redis_url=..., namespace=..., fence_url=<that database>)

    @app.task
    def send_receipt(ctx, order_id: int) -> None: ...

``manage.py migrate`` creates ``ringfence_fences`` and ``ringfence_failed_jobs`` (the same DDL as
``ringfence fence ddl``); ``manage.py ringfence worker -q default`` runs a worker of ``RINGFENCE["APP"]``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Concatenate, overload
from urllib.parse import quote, urlencode

from ringfence.app import App, load_app
from ringfence.errors import ConfigError
from ringfence.tasks import JobContext, P, R, Task

if TYPE_CHECKING:
    from pydantic import BaseModel

__all__ = ["DjangoApp", "Settings", "django_job", "fence_url", "get_app", "make_app", "settings"]

KEYS = ("APP", "REDIS_URL", "NAMESPACE", "ENVIRONMENT", "DATABASE", "FENCE_URL")

# Django database engines and the SQLAlchemy driver the fence store uses for them (ringfence's extras).
DRIVERS = {
    "django.db.backends.postgresql": "postgresql+psycopg",
    "django.db.backends.mysql": "mysql+pymysql",
    "django.db.backends.sqlite3": "sqlite",
}
# OPTIONS that Django reads itself; the rest are the driver's connection parameters.
DJANGO_ONLY_OPTIONS = {"isolation_level", "server_side_binding", "assume_role", "pool", "transaction_mode",
                       "init_command", "read_default_file", "timeout"}


@dataclass(frozen=True)
class Settings:
    """``settings.RINGFENCE``, checked: an unknown key is refused (a typo would silently change nothing)."""

    app: str | None = None
    redis_url: str | None = None
    namespace: str | None = None
    environment: str | None = None
    database: str = "default"
    fence_url: str | None = None


def settings() -> Settings:
    """``settings.RINGFENCE`` (a dict; missing: every value from ringfence's own defaults and environment)."""
    from django.conf import settings as dj

    raw = getattr(dj, "RINGFENCE", {})
    if not isinstance(raw, dict):
        raise ConfigError(f"settings.RINGFENCE must be a dict, not {type(raw).__name__}")
    unknown = sorted(set(raw) - set(KEYS))
    if unknown:
        raise ConfigError(f"settings.RINGFENCE: unknown key(s) {', '.join(map(repr, unknown))}; "
                          f"known: {', '.join(KEYS)}")
    return Settings(**{k.lower(): v for k, v in raw.items() if v is not None})


def fence_url(alias: str | None = None) -> str:
    """The SQLAlchemy URL of Django database ``alias`` (default: ``RINGFENCE["DATABASE"]``), for the fence store.

    PostgreSQL uses psycopg 3, MySQL/MariaDB PyMySQL (``pip install 'ringfence[postgres]'`` / ``[mysql]``);
    driver OPTIONS such as ``{"options": "-c search_path=shop"}`` are passed on, so the fence store sees the
    same schema as Django. ``RINGFENCE["FENCE_URL"]`` overrides it."""
    from django.conf import settings as dj

    s = settings()
    if alias is None and s.fence_url:
        return s.fence_url
    alias = alias or s.database
    db = dj.DATABASES.get(alias)
    if db is None:
        raise ConfigError(f"RINGFENCE['DATABASE'] = {alias!r} is not in settings.DATABASES "
                          f"(known: {', '.join(sorted(dj.DATABASES))})")
    engine = db.get("ENGINE", "")
    driver = DRIVERS.get(engine)
    if driver is None:
        raise ConfigError(f"database {alias!r}: ENGINE {engine!r} is not supported by the fence store; use "
                          f"{', '.join(DRIVERS)}, or set RINGFENCE['FENCE_URL'] to a SQLAlchemy URL")
    if driver == "sqlite":
        return f"sqlite:///{db['NAME']}"
    user = quote(str(db.get("USER") or ""), safe="")
    password = quote(str(db.get("PASSWORD") or ""), safe="")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = str(db.get("HOST") or "localhost")
    port = f":{db['PORT']}" if db.get("PORT") else ""
    options = {k: str(v) for k, v in (db.get("OPTIONS") or {}).items()
               if k not in DJANGO_ONLY_OPTIONS and isinstance(v, str | int)}
    query = f"?{urlencode(options)}" if options else ""
    return f"{driver}://{auth}{host}{port}/{quote(str(db['NAME']), safe='')}{query}"


def ensure_django() -> None:
    """Set Django up when a process starts from ``ringfence worker --app ...`` rather than manage.py
    (handlers use the ORM). Inside Django's own start-up (an app's ready()) it is left alone."""
    import django
    from django.apps import apps

    if not apps.ready and not apps.loading:
        django.setup()


def _close_stale_connections() -> None:
    """What Django does around each request (``close_old_connections``): close the connections of this thread
    that are broken or older than ``CONN_MAX_AGE`` — except one inside an atomic block (a test case's, or a
    caller's), which is not ours to close."""
    from django.db import connections

    for conn in connections.all(initialized_only=True):
        if not conn.in_atomic_block:
            conn.close_if_unusable_or_obsolete()


def django_job(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with stale Django connections closed before and after each call. A job thread lives for many
    jobs and Django closes connections only at the end of a request: without this, a connection the database
    dropped (a restart, a failover) would fail every later job of that thread. ``async def`` handlers are left
    as they are (the ORM runs in their ``sync_to_async`` calls)."""
    if inspect.iscoroutinefunction(fn):
        return fn

    @functools.wraps(fn)
    def job(*args: Any, **kwargs: Any) -> Any:
        _close_stale_connections()
        try:
            return fn(*args, **kwargs)
        finally:
            _close_stale_connections()

    return job


class DjangoApp(App):
    """An App whose sync handlers get Django's per-request connection handling (:func:`django_job`)."""

    @overload  # the typing of App.task
    def task(self, fn: Callable[Concatenate[JobContext, P], R], /) -> Task[P, R]: ...
    @overload
    def task(self, fn: None = None, /, *, payload: type[BaseModel],
             **options: Any) -> Callable[[Callable[Concatenate[JobContext, P], R]], Task[..., R]]: ...
    @overload
    def task(self, fn: None = None, /,
             **options: Any) -> Callable[[Callable[Concatenate[JobContext, P], R]], Task[P, R]]: ...

    def task(self, fn: Callable[..., Any] | None = None, /, **options: Any) -> Any:
        if fn is not None:
            return super().task(django_job(fn), **options)
        register: Callable[[Callable[..., Any]], Task] = super().task(**options)
        return lambda f: register(django_job(f))

    def periodic(self, cron: str, **options: Any) -> Any:
        register = super().periodic(cron, **options)
        return lambda f: register(django_job(f))


def make_app(**options: Any) -> DjangoApp:
    """A :class:`DjangoApp` configured from ``settings.RINGFENCE``: its Redis URL, namespace, environment and
    the Django database for the fence tables. ``options`` are passed to ``App`` as well
    (``worker=WorkerSettings(...)``, ``retry=...``, ...); a value given there wins over the setting."""
    ensure_django()
    s = settings()
    options.setdefault("redis_url", s.redis_url)
    options.setdefault("namespace", s.namespace)
    options.setdefault("environment", s.environment)
    options.setdefault("fence_url", fence_url())
    return DjangoApp(**options)


def get_app() -> App:
    """The App named by ``RINGFENCE["APP"]`` (``"package.module:attr"``), imported once."""
    s = settings()
    if not s.app:
        raise ConfigError("settings.RINGFENCE['APP'] is not set: name your App, e.g. 'shop.jobs:app'")
    return load_app(s.app)
