"""ringfence beside other Redis job queues: ``python -m bench.peers`` (``make bench-peers``).

One adapter per library in ``adapters/``, each run from the library's own venv; the harness (this package)
runs from a venv of its own and talks to them through worker processes, a producer process and a private
redis-server. See docs/benchmarks.md, "ringfence beside other Redis job queues".
"""
