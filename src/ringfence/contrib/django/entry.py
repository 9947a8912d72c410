"""``--app ringfence.contrib.django.entry:app``: Django set up first, then the App named by ``RINGFENCE["APP"]``.

For processes that start outside ``manage.py`` with ``DJANGO_SETTINGS_MODULE`` set: the child processes of
``manage.py ringfence worker --processes N``, or ``ringfence worker --app ringfence.contrib.django.entry:app``
from a shell. Your module of tasks can then import its models at the top. Importing this module does nothing;
reading ``app`` does the set-up."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "app":
        from ringfence.contrib.django import _ensure_django, get_app

        _ensure_django()
        return get_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
