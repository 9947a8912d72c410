"""``--app ringfence.contrib.django.entry:app``: Django set up first, then the App named by ``RINGFENCE["APP"]``.

For processes that start outside ``manage.py`` with ``DJANGO_SETTINGS_MODULE`` set: the child processes of
``manage.py ringfence worker --processes N``, or ``ringfence worker --app ringfence.contrib.django.entry:app``
from a shell. Your module of tasks can then import its models at the top. Importing this module does nothing;
reading ``app`` does the set-up."""

from __future__ import annotations

import os
from typing import Any

from ringfence.errors import ConfigError


def __getattr__(name: str) -> Any:
    if name == "app":
        from django.conf import settings

        from ringfence.contrib.django import ensure_django, get_app

        module = os.environ.get("DJANGO_SETTINGS_MODULE")
        if not settings.configured and not module:
            raise ConfigError(f"--app {__name__}:app needs DJANGO_SETTINGS_MODULE set to your settings module "
                              "(e.g. mysite.settings), or run the command as `manage.py ringfence ...`")
        try:
            ensure_django()
        except ImportError as exc:
            raise ConfigError(f"--app {__name__}:app: cannot import DJANGO_SETTINGS_MODULE={module!r}: {exc}") from exc
        return get_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
