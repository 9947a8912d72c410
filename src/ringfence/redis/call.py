"""An operation on Redis as data: script name, keys, arguments and the parser of its reply."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, NamedTuple, TypeVar

T = TypeVar("T")


class Call(NamedTuple, Generic[T]):  # a tuple: a third of a frozen dataclass's cost to build, on every enqueue
    name: str
    keys: Sequence[str]
    args: Sequence[Any]
    parse: Callable[[Any], T]


def _ids(raw: Any) -> list[str]:
    return [x.decode() if isinstance(x, bytes) else str(x) for x in raw or []]


def _str(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


