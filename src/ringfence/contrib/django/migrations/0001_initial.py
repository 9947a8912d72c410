"""ringfence_fences and ringfence_failed_jobs, created with ringfence's DDL (``ringfence fence ddl``)."""

from django.db import migrations, models

import ringfence.contrib.django.models
from ringfence.contrib.django.tables import creator, dropper
from ringfence.fence.schema import ddl


class Migration(migrations.Migration):
    initial = True
    dependencies: list[tuple[str, str]] = []

    operations = [
        migrations.RunPython(creator(ddl), dropper("ringfence_fences", "ringfence_failed_jobs")),
        migrations.CreateModel(
            name="Fence",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("subject", models.CharField(max_length=255)),
                ("step", models.CharField(max_length=128)),
                ("state", models.CharField(max_length=16)),
                ("epoch", models.IntegerField()),
                ("owner_job_id", models.CharField(max_length=255, null=True)),
                ("owner_token", models.CharField(max_length=255, null=True)),
                ("lease_until", models.DateTimeField(null=True)),
                ("params_hash", models.CharField(max_length=64)),
                ("request", models.TextField(null=True)),
                ("provider_key", models.CharField(max_length=64)),
                ("reference", models.CharField(max_length=255, null=True)),
                ("result", models.TextField(null=True)),
                ("retention_s", models.FloatField(null=True)),
                ("created_at", models.DateTimeField()),
                ("updated_at", models.DateTimeField()),
                ("calling_at", models.DateTimeField(null=True)),
                ("completed_at", models.DateTimeField(null=True)),
            ],
            options={
                "db_table": "ringfence_fences",
                "ordering": ("-updated_at", "-id"),
                "permissions": (("resolve_fence", "Can resolve an in-doubt fence step"),),
                "managed": False,
            },
        ),
        migrations.CreateModel(
            name="FailedJob",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("job_id", models.CharField(max_length=255)),
                ("namespace", models.CharField(max_length=255, null=True)),
                ("queue", models.CharField(max_length=255)),
                ("task", models.CharField(max_length=255)),
                ("payload", ringfence.contrib.django.models.StoredJSON()),
                ("reason", models.CharField(max_length=64)),
                ("error", models.TextField(null=True)),
                ("traceback", models.TextField(null=True)),
                ("attempts", models.IntegerField(default=0)),
                ("history", ringfence.contrib.django.models.StoredJSON(null=True)),
                ("died_at", models.DateTimeField()),
                ("replayed_at", models.DateTimeField(null=True)),
            ],
            options={
                "verbose_name": "dead job",
                "db_table": "ringfence_failed_jobs",
                "ordering": ("-died_at", "-id"),
                "permissions": (("replay_failedjob", "Can replay a dead job"),),
                "managed": False,
            },
        ),
    ]
