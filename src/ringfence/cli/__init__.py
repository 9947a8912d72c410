"""The ``ringfence`` command: the group (``base.py``) with every command module registered on it."""

from ringfence.cli import contracts, dashboard, dead, demo, fence, jobs, observe, ops, outbox, worker, workflow
from ringfence.cli.base import app_option, main

__all__ = ["app_option", "contracts", "dashboard", "dead", "demo", "fence", "jobs", "main", "observe", "ops",
           "outbox", "worker", "workflow"]
