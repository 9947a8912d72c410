"""ringfence_outbox (``task.enqueue_in``), created with ringfence's DDL (``ringfence outbox ddl``)."""

from django.db import migrations, models

from ringfence.contrib.django.tables import creator, dropper
from ringfence.outbox import outbox_ddl


class Migration(migrations.Migration):
    dependencies = [("ringfence", "0001_initial")]

    operations = [
        migrations.RunPython(creator(outbox_ddl), dropper("ringfence_outbox")),
        migrations.CreateModel(
            name="OutboxRow",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("namespace", models.CharField(max_length=255)),
                ("job_id", models.CharField(max_length=255)),
                ("queue", models.CharField(max_length=255)),
                ("task", models.CharField(max_length=255)),
                ("spec", models.TextField()),
                ("run_at_ms", models.BigIntegerField(null=True)),
                ("unique_key", models.CharField(max_length=255, null=True)),
                ("unique_until_ms", models.BigIntegerField(null=True)),
                ("min_replicas", models.IntegerField(null=True)),
                ("created_at", models.DateTimeField()),
            ],
            options={
                "verbose_name": "outbox row",
                "db_table": "ringfence_outbox",
                "ordering": ("id",),
                "managed": False,
            },
        ),
    ]
