"""``redis/connection.py``'s cluster client keeps its connections open when redis-py's asyncio cluster client
closes itself after a failure it handled (``_execute_command``, a pipeline's ``execute``), and only has its slot map
reloaded. It recognises those closes by the caller's name and sets the client's ``_initialize``: if redis-py
renames either, the override silently falls back to redis-py's close (every node's connections dropped on each
failure, the healthy masters' in-flight replies lost). This fails first."""

from __future__ import annotations

import inspect
import re

from redis.asyncio import cluster as aiocluster

from ringfence.redis import connection


def _callers_of_aclose() -> set[str]:
    callers, current = set(), None
    for line in inspect.getsource(aiocluster).splitlines():
        found = re.match(r"\s*(?:async )?def (\w+)\(", line)
        if found:
            current = found.group(1)
        elif current and re.search(r"\b(?:self|self\._pipe\.cluster_client)\.aclose\(\)", line):
            callers.add(current)
    return callers


def test_the_closes_it_keeps_open_are_still_redis_py_s_own() -> None:
    resets = connection._OWN_RESETS
    assert resets <= _callers_of_aclose(), f"redis-py no longer closes itself from {resets - _callers_of_aclose()}"


def test_redis_py_still_reloads_its_slot_map_on_initialize() -> None:
    client_source = inspect.getsource(aiocluster.RedisCluster)
    assert "self._initialize = True" in client_source and "if self._initialize:" in client_source
    assert issubclass(connection._AsyncCluster, aiocluster.RedisCluster)
