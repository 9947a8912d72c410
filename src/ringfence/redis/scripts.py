"""Lua scripts, read once from lua/*.lua and run by SHA (loaded into Redis on first NOSCRIPT)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache
from importlib import resources


@dataclass(frozen=True)
class Script:
    name: str
    source: str
    sha: str


@cache
def script(name: str) -> Script:
    source = resources.files("ringfence.redis").joinpath("lua", f"{name}.lua").read_text()
    return Script(name, source, hashlib.sha1(source.encode()).hexdigest())
