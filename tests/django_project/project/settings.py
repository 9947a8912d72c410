"""The test project's settings: PostgreSQL ``test`` on 127.0.0.1 in a schema of its own (RINGFENCE_DJANGO_SCHEMA,
made and dropped by conftest.py), so it never touches anyone else's tables; Redis under a namespace of its own."""

import os

SCHEMA = os.environ.get("RINGFENCE_DJANGO_SCHEMA", "ringfence_django")

SECRET_KEY = "test-only"
DEBUG = False
ALLOWED_HOSTS = ["testserver", "127.0.0.1"]
USE_TZ = True
ROOT_URLCONF = "project.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast logins in tests

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "ringfence.contrib.django",
    "shop",
]

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "test",
        "USER": os.environ.get("RINGFENCE_DJANGO_PG_USER", "root"),
        "HOST": "127.0.0.1",
        "PORT": 5432,
        "OPTIONS": {"options": f"-c search_path={SCHEMA}"},
    },
}

RINGFENCE = {
    "APP": "shop.jobs:app",
    "REDIS_URL": os.environ.get("RINGFENCE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"),
    "NAMESPACE": os.environ.get("RINGFENCE_DJANGO_NAMESPACE", "ringfence_django"),
    "ENVIRONMENT": "test",
    "DATABASE": "default",
}
