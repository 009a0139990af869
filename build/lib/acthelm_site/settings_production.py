"""Production settings: the base settings, hardened so that `manage.py check --deploy` passes.

Use with DJANGO_SETTINGS_MODULE=acthelm_site.settings_production. Required from the environment:
DJANGO_SECRET_KEY and DATABASE_URL (production never starts the embedded PostgreSQL). Optional:

- DJANGO_ALLOWED_HOSTS          comma-separated host names (default: localhost,127.0.0.1)
- DJANGO_CSRF_TRUSTED_ORIGINS   comma-separated origins, e.g. https://acthelm.example.com
- DJANGO_SECURE_SSL_REDIRECT    redirect http to https (default on; /healthz is exempt)
- DJANGO_SECURE_HSTS_SECONDS    HSTS max-age (default one year), with subdomains and preload
  (DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS, DJANGO_SECURE_HSTS_PRELOAD, both default on)
- DJANGO_STATIC_ROOT            where collectstatic writes, whitenoise reads (default staticfiles/)
- ACTHELM_BEHIND_PROXY          trust X-Forwarded-Proto from a TLS-terminating proxy (default off;
  turn it on only when every request passes through that proxy, which must set the header)

Static files are served by whitenoise from STATIC_ROOT (run `collectstatic` first).
"""

import os
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured


def _required(name: str, hint: str) -> str:
    value = os.environ.get(name, "").strip()
    if not value:
        raise ImproperlyConfigured(
            f"{name} is not set: the production settings need it from the environment ({hint})"
        )
    return value


# Checked before the base settings are imported: they would otherwise fall back to a development
# key and to the embedded PostgreSQL.
_SECRET_KEY = _required(
    "DJANGO_SECRET_KEY",
    "50 or more random characters, e.g. "
    "python -c 'import secrets; print(secrets.token_urlsafe(50))'",
)
_required("DATABASE_URL", "postgresql://user:password@host:5432/dbname")
if _SECRET_KEY == "acthelm-development-key-not-for-production":
    raise ImproperlyConfigured("DJANGO_SECRET_KEY is the public development key: set a secret one")

from acthelm_site.settings import *  # noqa: E402, F403
from acthelm_site.settings import (  # noqa: E402
    EMAIL_HOST_FROM_ENV,
    MIDDLEWARE,
    env_bool,
    env_int,
    env_list,
    smtp_mailer,
)

DEBUG = False
SECRET_KEY = _SECRET_KEY
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", ["localhost", "127.0.0.1"])
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", [])
# Notification email is never printed to a console here: SMTP to EMAIL_HOST, else the local MTA.
MAILERS = {"default": smtp_mailer(EMAIL_HOST_FROM_ENV or "localhost")}

SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
SESSION_COOKIE_HTTPONLY = True

SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", True)
# Load balancers and container health checks probe over plain HTTP.
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
SECURE_HSTS_SECONDS = env_int("DJANGO_SECURE_HSTS_SECONDS", 31_536_000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
SECURE_HSTS_PRELOAD = env_bool("DJANGO_SECURE_HSTS_PRELOAD", True)
SECURE_CONTENT_TYPE_NOSNIFF = True

ACTHELM_BEHIND_PROXY = env_bool("ACTHELM_BEHIND_PROXY", False)
if ACTHELM_BEHIND_PROXY:
    # Only safe when the proxy sets (and overwrites) X-Forwarded-Proto on every request.
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# whitenoise serves the collected, hashed and compressed static files right after the security
# middleware, before sessions and auth are touched.
MIDDLEWARE = list(MIDDLEWARE)
MIDDLEWARE.insert(
    MIDDLEWARE.index("django.middleware.security.SecurityMiddleware") + 1,
    "whitenoise.middleware.WhiteNoiseMiddleware",
)
STATIC_ROOT = Path(os.environ.get("DJANGO_STATIC_ROOT") or STATIC_ROOT)  # noqa: F405
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}
