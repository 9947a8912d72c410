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


def as_texts(raw: Any) -> list[str]:
    """A reply's items as str (bytes decoded)."""
    return [x.decode() if isinstance(x, bytes) else str(x) for x in raw or []]


def as_text(raw: Any) -> str:
    """A reply as str (bytes decoded)."""
    return raw.decode() if isinstance(raw, bytes) else str(raw)


