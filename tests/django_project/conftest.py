"""A real Django project (tests/django_project) on PostgreSQL: a schema of its own in database ``test``, created
and migrated once per session with ``call_command("migrate")`` and dropped at the end; a Redis namespace of its
own. Django is set up only when these tests run."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from support import service_missing

HERE = Path(__file__).resolve().parent
PG = "postgresql://{user}@127.0.0.1:5432/test"


@pytest.fixture(scope="session")
def django_project(redis_url: str) -> Iterator[dict[str, str]]:
    import psycopg

    schema, namespace = f"rfdj_{uuid.uuid4().hex[:10]}", f"tdj{uuid.uuid4().hex[:10]}"
    user = os.environ.get("RINGFENCE_DJANGO_PG_USER", "root")
    try:
        pg = psycopg.connect(PG.format(user=user), autocommit=True)
    except psycopg.Error as exc:
        service_missing("PostgreSQL", str(exc))
    pg.execute(f"CREATE SCHEMA {schema}")
    env = {"RINGFENCE_DJANGO_SCHEMA": schema, "RINGFENCE_DJANGO_NAMESPACE": namespace,
           "RINGFENCE_TEST_REDIS_URL": redis_url, "DJANGO_SETTINGS_MODULE": "project.settings"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    sys.path.insert(0, str(HERE))
    try:
        import django
        from django.core.management import call_command

        django.setup()
        call_command("migrate", verbosity=0)
        yield {**env, "PYTHONPATH": str(HERE)}
    finally:
        from django.db import connections

        connections.close_all()
        pg.execute(f"DROP SCHEMA {schema} CASCADE")
        pg.close()
        r = redis.Redis.from_url(redis_url)
        keys = list(r.scan_iter(f"{namespace}:*", count=1000))
        if keys:
            r.delete(*keys)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
