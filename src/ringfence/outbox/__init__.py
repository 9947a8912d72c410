"""The transactional outbox: ``task.enqueue_in(conn, **payload)`` writes a job in the caller's transaction;
the relay (``ringfence relay``) moves committed rows to Redis once each. See docs/outbox.md."""

from ringfence.outbox.schema import COLUMNS, OUTBOX_TABLE, create_outbox, outbox_ddl, outbox_table

__all__ = ["COLUMNS", "OUTBOX_TABLE", "create_outbox", "outbox_ddl", "outbox_table"]
