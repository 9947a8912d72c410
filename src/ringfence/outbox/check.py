"""What the relay checks in a row before sending it: the row may have been written by hand, by another
program or by an older version, and a job id or queue name Redis would store under the wrong key, or a spec a
worker cannot read, would reach Redis as a phantom job. Such a row is parked with the reason, never sent.
A task no worker knows is sent: the worker dead-letters it, with the reason, as for ``enqueue``."""

from __future__ import annotations

from ringfence.errors import BadRecord, ConfigError
from ringfence.models import JobSpec
from ringfence.outbox.store import Waiting
from ringfence.redis.keys import logical_queue
from ringfence.settings import check_name


def problem(row: Waiting, max_bytes: int | None) -> str | None:
    """Why ``row`` cannot be sent as it is, in one line; None when it can."""
    try:
        check_name("job id", row.job_id)
        check_name("queue", logical_queue(row.queue))  # a partition (keys.partition_name) is named after its queue
    except ConfigError as exc:
        return str(exc)
    if max_bytes is not None and len(row.spec) > max_bytes:
        return f"the job is {len(row.spec):,} bytes, above max_payload_bytes={max_bytes:,}"
    try:
        JobSpec.decode(row.spec)
    except (BadRecord, ValueError, TypeError) as exc:
        return f"unreadable job: {exc}"
    return None
