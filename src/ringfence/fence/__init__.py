"""Fences: execution-level idempotency for side effects (the second run is empty).

Public names::

    Owner, Fences, Step, AsyncStep, StepOptions, NOT_HAPPENED   the protocol handlers use
    FenceStore, create_all, ddl, fence_table, failed_jobs_table  the SQL store and its schema
    FenceRow, FenceState                                         what the store returns
    DbRetry                                                      how fence writes ride out a dead connection
"""

from .dbretry import DbRetry
from .model import FenceRow, FenceState, Owner
from .schema import create_all, ddl, failed_jobs_table, fence_table
from .step import NOT_HAPPENED, AsyncStep, FenceContext, Fences, Step, StepOptions
from .store import FenceStore

__all__ = [
    "NOT_HAPPENED",
    "AsyncStep",
    "DbRetry",
    "FenceContext",
    "FenceRow",
    "FenceState",
    "FenceStore",
    "Fences",
    "Owner",
    "Step",
    "StepOptions",
    "create_all",
    "ddl",
    "failed_jobs_table",
    "fence_table",
]
