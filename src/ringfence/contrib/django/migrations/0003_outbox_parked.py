"""ringfence_outbox's parked_at and parked_reason (rows the relay parks): added to a table made before them;
a table 0002 made with them is left as it is."""

from typing import Any

from django.db import migrations, models

from ringfence.contrib.django.tables import dialect
from ringfence.outbox.schema import OUTBOX_TABLE, later_column_types


def add_columns(apps: Any, schema_editor: Any) -> None:
    conn = schema_editor.connection
    with conn.cursor() as cursor:
        have = {c.name for c in conn.introspection.get_table_description(cursor, OUTBOX_TABLE)}
    for name, kind in later_column_types(dialect(conn)):
        if name not in have:
            schema_editor.execute(f"ALTER TABLE {OUTBOX_TABLE} ADD COLUMN {name} {kind}", params=None)


class Migration(migrations.Migration):
    dependencies = [("ringfence", "0002_outbox")]

    operations = [
        migrations.RunPython(add_columns, migrations.RunPython.noop),
        migrations.AddField(model_name="outboxrow", name="parked_at", field=models.DateTimeField(null=True)),
        migrations.AddField(model_name="outboxrow", name="parked_reason", field=models.TextField(null=True)),
    ]
