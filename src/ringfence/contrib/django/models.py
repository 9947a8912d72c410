"""Read-only Django models over ringfence's own tables (for the admin and your queries).

The tables are created by this app's migrations with ringfence's DDL (``ringfence.fence.schema``), so
``managed = False``: Django never alters them; ringfence's statements are the only writers."""

from __future__ import annotations

from django.db import models


class StoredJSON(models.JSONField):
    """A JSONField that also reads PostgreSQL ``json`` columns (ringfence's DDL), which psycopg decodes itself
    (Django only expects text back from ``jsonb``)."""

    def from_db_value(self, value: object, expression: object, connection: object) -> object:
        if value is None or not isinstance(value, str | bytes | bytearray):
            return value
        return super().from_db_value(value, expression, connection)


class Fence(models.Model):
    """One fenced step: (subject, step), e.g. (``order:42``, ``charge``)."""

    id = models.BigAutoField(primary_key=True)
    subject = models.CharField(max_length=255)
    step = models.CharField(max_length=128)
    state = models.CharField(max_length=16)
    epoch = models.IntegerField()
    owner_job_id = models.CharField(max_length=255, null=True)
    owner_token = models.CharField(max_length=255, null=True)
    lease_until = models.DateTimeField(null=True)
    params_hash = models.CharField(max_length=64)
    request = models.TextField(null=True)
    provider_key = models.CharField(max_length=64)
    reference = models.CharField(max_length=255, null=True)
    result = models.TextField(null=True)
    retention_s = models.FloatField(null=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    calling_at = models.DateTimeField(null=True)
    completed_at = models.DateTimeField(null=True)

    class Meta:
        managed = False
        db_table = "ringfence_fences"
        ordering = ("-updated_at", "-id")
        permissions = (("resolve_fence", "Can resolve an in-doubt fence step"),)

    def __str__(self) -> str:
        return f"{self.subject}/{self.step}"


class FailedJob(models.Model):
    """A dead job kept in SQL (``ringfence_failed_jobs``): replayable after Redis lost it."""

    id = models.BigAutoField(primary_key=True)
    job_id = models.CharField(max_length=255)
    namespace = models.CharField(max_length=255, null=True)
    queue = models.CharField(max_length=255)
    task = models.CharField(max_length=255)
    payload = StoredJSON()
    reason = models.CharField(max_length=64)
    error = models.TextField(null=True)
    traceback = models.TextField(null=True)
    attempts = models.IntegerField(default=0)
    history = StoredJSON(null=True)
    died_at = models.DateTimeField()
    replayed_at = models.DateTimeField(null=True)

    class Meta:
        managed = False
        db_table = "ringfence_failed_jobs"
        ordering = ("-died_at", "-id")
        verbose_name = "dead job"
        permissions = (("replay_failedjob", "Can replay a dead job"),)

    def __str__(self) -> str:
        return str(self.job_id)


class OutboxRow(models.Model):
    """A job written by ``task.enqueue_in(connection, ...)``, waiting for the relay (``ringfence relay``), which
    deletes it once it is in Redis, or parks it with the reason (``parked_at``) when it cannot send it."""

    id = models.BigAutoField(primary_key=True)
    namespace = models.CharField(max_length=255)
    job_id = models.CharField(max_length=255)
    queue = models.CharField(max_length=255)
    task = models.CharField(max_length=255)
    spec = models.TextField()
    run_at_ms = models.BigIntegerField(null=True)
    unique_key = models.CharField(max_length=255, null=True)
    unique_until_ms = models.BigIntegerField(null=True)
    min_replicas = models.IntegerField(null=True)
    created_at = models.DateTimeField()
    parked_at = models.DateTimeField(null=True)
    parked_reason = models.TextField(null=True)

    class Meta:
        managed = False
        db_table = "ringfence_outbox"
        ordering = ("id",)
        verbose_name = "outbox row"

    def __str__(self) -> str:
        return str(self.job_id)
