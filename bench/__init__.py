"""Benchmarks, kept out of the installed package: ``python -m bench`` (ringfence alone, ``make bench``) and
``python -m bench.peers`` (ringfence beside other Redis job queues, ``make bench-peers``). Run from the repo root.
``python -m bench.chaos`` (``make chaos``) is the chaos run of docs/chaos.md. ``python -m bench.drain_cpu``: worker CPU,
context switches and script calls per job of one worker draining the peer job (before/after comparisons).
``python -m bench.enqueue_cpu``: CPU and Redis script time per ``task.enqueue`` of one producer (before/after).
``python -m bench.wake_latency``: enqueue-to-start of one idle worker at 200 jobs/s, with the same per-job costs."""
