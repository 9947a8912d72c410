"""The Django app config: ``INSTALLED_APPS = [..., "ringfence.contrib.django"]``."""

from __future__ import annotations

from django.apps import AppConfig


class RingfenceConfig(AppConfig):
    name = "ringfence.contrib.django"
    label = "ringfence"
    verbose_name = "ringfence"
    default_auto_field = "django.db.models.BigAutoField"
