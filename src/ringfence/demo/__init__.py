"""``ringfence demo``: a double charge under SIGKILL, then the same chaos with a fence.

- :mod:`ringfence.demo.provider`: a fake payment provider (HTTP server process, own storage,
  honours ``Idempotency-Key``);
- :mod:`ringfence.demo.app`: the worker app with a naive and a fenced charge handler;
- :mod:`ringfence.demo.run`: starts everything, kills workers, counts, tears down.
"""
