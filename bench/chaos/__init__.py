"""``make chaos``: the guarantees of issue 9 under every fault at once (see docs/chaos.md).

- :mod:`bench.chaos.provider`: two payment providers in one HTTP process (one honours keys, one does not);
- :mod:`bench.chaos.app`: the worker app (fenced charges, a replay for one provider, a reconcile hook for the other);
- :mod:`bench.chaos.run`: the driver; :mod:`bench.chaos.faults`: the faults it fires;
- :mod:`bench.chaos.collect`, :mod:`bench.chaos.checks`, :mod:`bench.chaos.doctor`: the verdict;
- ``python -m bench.chaos --help``: the command.
"""
