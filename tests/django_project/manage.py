#!/usr/bin/env python
"""The test project's manage.py (``python manage.py ringfence worker ...`` runs a worker of shop.jobs:app)."""

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
