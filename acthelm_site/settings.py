"""Settings for Acthelm, read from the environment (12-factor).

DATABASE_URL selects the PostgreSQL server; when it is unset an embedded server is started in
`.pgdata/`. Every ACTHELM_* setting below can be set from the environment of the same name.
"""

import ipaddress
import os
from pathlib import Path
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

from core.credentials import WELL_KNOWN_DESTINATIONS, parse_destinations
from core.dburl import parse_database_url
from tasks.limits import LIMITS

BASE_DIR = Path(__file__).resolve().parent.parent


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() in ("1", "true", "yes", "on")


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value not in (None, "") else default


def env_list(name: str, default: list[str]) -> list[str]:
    value = os.environ.get(name)
    if value is None:
        return default
    return [item.strip() for item in value.split(",") if item.strip()]


# Without DJANGO_SECRET_KEY this is a developer's machine (`make run`, the tests): a public
# development key and DEBUG on. Given a key, DEBUG is off unless DJANGO_DEBUG turns it on. The
# development key with DEBUG off is refused: that is a server someone forgot to configure.
DEVELOPMENT_SECRET_KEY = "acthelm-development-key-not-for-production"
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "").strip() or DEVELOPMENT_SECRET_KEY
DEBUG = env_bool("DJANGO_DEBUG", SECRET_KEY == DEVELOPMENT_SECRET_KEY)
if not DEBUG and SECRET_KEY == DEVELOPMENT_SECRET_KEY:
    raise ImproperlyConfigured(
        "DEBUG is off but DJANGO_SECRET_KEY is not set (or is the public development key): "
        "set DJANGO_SECRET_KEY to 50 or more random characters, e.g. "
        "python -c 'import secrets; print(secrets.token_urlsafe(50))'"
    )
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "testserver"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "django_htmx",
    # The API docs' Swagger UI from our own static files, not from a CDN.
    "ninja",
    "tasks",
    "agents",
    "approvals",
    "memory",
    "schedules",
    "console",
    "acthelm_site.api",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "acthelm_site.api.middleware.ApiJsonErrors",  # /api/ errors as the API's JSON, never HTML
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "acthelm_site.urls"
WSGI_APPLICATION = "acthelm_site.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "console.context_processors.console",
            ],
        },
    },
]


def _database_url() -> str:
    url = os.environ.get("DATABASE_URL", "").strip()
    if url:
        return url
    from core.embedded_pg import ensure_server

    return ensure_server()


DATABASES = {"default": parse_database_url(_database_url())}
DATABASES["default"]["CONN_MAX_AGE"] = env_int("ACTHELM_CONN_MAX_AGE", 0)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
DATABASES["default"]["TEST"] = {"NAME": os.environ.get("ACTHELM_TEST_DB_NAME") or None}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
LOGIN_URL = "/admin/login/"
LOGIN_REDIRECT_URL = "/"

# Where task workspaces (input files) and artifacts live, one folder per task.
ACTHELM_MEDIA_ROOT = Path(os.environ.get("ACTHELM_MEDIA_ROOT", BASE_DIR / "var" / "media"))

# The worker: leases, heartbeats, recovery, retries, provider health.
ACTHELM_LEASE_SECONDS = env_float("ACTHELM_LEASE_SECONDS", 60)
ACTHELM_HEARTBEAT_SECONDS = env_float("ACTHELM_HEARTBEAT_SECONDS", 10)
ACTHELM_RUN_TIMEOUT_SECONDS = env_float("ACTHELM_RUN_TIMEOUT_SECONDS", 900)
ACTHELM_RECOVER_INTERVAL_SECONDS = env_float("ACTHELM_RECOVER_INTERVAL_SECONDS", 30)
ACTHELM_RECONCILE_INTERVAL_SECONDS = env_float("ACTHELM_RECONCILE_INTERVAL_SECONDS", 60)
# Schedules: with catch-up "none", a slot decided later than this after its time is missed.
ACTHELM_SCHEDULE_CATCH_UP_GRACE_SECONDS = env_float("ACTHELM_SCHEDULE_CATCH_UP_GRACE_SECONDS", 300)
ACTHELM_POLL_SECONDS = env_float("ACTHELM_POLL_SECONDS", 5)
# How often the console's pages refresh what needs a person (the nav's counts, the task list, the
# inbox, the review page) without a reload.
ACTHELM_CONSOLE_REFRESH_SECONDS = env_int("ACTHELM_CONSOLE_REFRESH_SECONDS", 10)
# A worker process's database connections: a pool of this many (Django's psycopg pool), borrowed
# only to read or write, plus the heartbeat's own connection and one LISTEN connection, whatever
# --concurrency says. 0 = no pool (a connection per thread). A thread waits this long for a free
# connection.
ACTHELM_DB_POOL_SIZE = env_int("ACTHELM_DB_POOL_SIZE", 4)
ACTHELM_DB_POOL_TIMEOUT_SECONDS = env_float("ACTHELM_DB_POOL_TIMEOUT_SECONDS", 30)
# The worker's LISTEN connection (new work, a person's pause or cancel) goes to this PostgreSQL URL,
# every option of it kept (sslmode, options, connect_timeout, …); empty = the default database
# (DATABASE_URL, or the embedded server). Behind a transaction-mode pooler, point it at PostgreSQL
# itself: LISTEN does not work through one (docs/operations.md, "Connections and PgBouncer").
ACTHELM_LISTEN_DATABASE_URL = os.environ.get("ACTHELM_LISTEN_DATABASE_URL", "").strip()
if ACTHELM_LISTEN_DATABASE_URL:  # a wrong URL stops the start, not the listener later
    parse_database_url(ACTHELM_LISTEN_DATABASE_URL, name="ACTHELM_LISTEN_DATABASE_URL")
# The live channel (tasks/live.py, tasks/livestream.py): how many streams of a task's events one
# web process serves at once; past it a stream is refused, 503 with Retry-After. Each holds one of
# the server's threads for as long as it is open (docs/operations.md, "Watching a task live").
ACTHELM_LIVE_MAX_VIEWERS = env_int("ACTHELM_LIVE_MAX_VIEWERS", 8)
# A worker asks its model for a streamed answer (Server-Sent Events), so that a watched task's
# turn is shown as it is written; off, every answer comes whole (and nothing is shown until the
# turn is stored). The stored turn is the same either way.
ACTHELM_STREAM_TURNS = env_bool("ACTHELM_STREAM_TURNS", True)
# How many ready tasks one claim statement may take for a worker's free places.
ACTHELM_CLAIM_BATCH = env_int("ACTHELM_CLAIM_BATCH", 50)
# A worker runs its tasks as fibers on this many step threads (0 = one per core, at most
# ACTHELM_DB_POOL_SIZE): a run waiting for its model, a tool's request or an MCP server holds no
# thread. While the oldest ready run has waited longer than ACTHELM_CLAIM_MAX_LAG_SECONDS for a
# step thread (or the event loop runs that late), the worker claims nothing more.
ACTHELM_STEP_THREADS = env_int("ACTHELM_STEP_THREADS", 0)
ACTHELM_CLAIM_MAX_LAG_SECONDS = env_float("ACTHELM_CLAIM_MAX_LAG_SECONDS", 0.25)
# A task gets ACTHELM_MAX_ATTEMPTS attempts in all, the first run among them: after attempt n
# fails, attempt n+1 runs ACTHELM_RETRY_DELAYS[n-1] seconds later (the last delay repeats); the
# failure of the last attempt fails the task. A run that stops without failing (a pause, an
# approval, a hand-back) is not an attempt.
ACTHELM_RETRY_DELAYS = [int(x) for x in env_list("ACTHELM_RETRY_DELAYS", ["60", "300"])]
ACTHELM_MAX_ATTEMPTS = env_int("ACTHELM_MAX_ATTEMPTS", 3)
ACTHELM_COOLDOWN_SECONDS = env_float("ACTHELM_COOLDOWN_SECONDS", 1800)
ACTHELM_MAX_REQUEUES = env_int("ACTHELM_MAX_REQUEUES", 1)
# Hand-backs (graceful shutdown, a lost database connection) are not attempts; this many in a
# row fail the task (handback_loop), so that nothing can cycle a task without end.
ACTHELM_MAX_HANDBACKS = env_int("ACTHELM_MAX_HANDBACKS", 10)

# Per-task limits: the defaults copied onto every new task, one setting per row of the limits
# table (tasks/limits.py): ACTHELM_LIMIT_TURNS, _RUNTIME_SECONDS, _OUTPUT_TOKENS, _TOKEN_BUDGET,
# _TOOL_OUTPUT_CHARS, _NETWORK_REQUESTS, _ARTIFACT_BYTES, _MCP_CALLS, and ACTHELM_LIMIT_COST (a
# money budget in US dollars; empty = none).
globals().update({limit.setting: limit.from_environment() for limit in LIMITS})
# OpenTelemetry: spans carry tool arguments only when this is on (they may hold secrets).
ACTHELM_OTEL_TOOL_ARGUMENTS = env_bool("ACTHELM_OTEL_TOOL_ARGUMENTS", False)

# Tools and policies.
ACTHELM_DEFAULT_TOOLS = env_list(
    "ACTHELM_DEFAULT_TOOLS",
    ["update_plan", "list_files", "read_file", "search_files", "analyze_csv", "write_artifact"],
)
ACTHELM_FETCH_ALLOW_PRIVATE = env_bool("ACTHELM_FETCH_ALLOW_PRIVATE", False)
# Exact "address:port" endpoints fetch_url may reach although they are not public (comma-separated),
# e.g. the evaluation's page server, which `acthelm_eval run --allow-loopback-fetch` sets for the
# workers it starts: that one server, not all of loopback.
ACTHELM_FETCH_ALLOW_ENDPOINTS = env_list("ACTHELM_FETCH_ALLOW_ENDPOINTS", [])
# How many follow-up tasks one task may create with propose_task.
ACTHELM_MAX_PROPOSALS_PER_TASK = env_int("ACTHELM_MAX_PROPOSALS_PER_TASK", 20)
ACTHELM_AUTO_CLOSE_GOAL_NO_WORK = env_bool("ACTHELM_AUTO_CLOSE_GOAL_NO_WORK", False)
ACTHELM_MEMORY_BUDGET_CHARS = env_int("ACTHELM_MEMORY_BUDGET_CHARS", 8_000)
# MCP servers are hostile: one message (a tool's result, a page of its tool list) over this many
# bytes fails the call (mcp_result_too_large) before it is read whole; a tool's description is
# cut to this many characters and framed as the server's text before the model sees it.
ACTHELM_MCP_MAX_RESULT_BYTES = env_int("ACTHELM_MCP_MAX_RESULT_BYTES", 1_000_000)
ACTHELM_MCP_DESCRIPTION_MAX_CHARS = env_int("ACTHELM_MCP_DESCRIPTION_MAX_CHARS", 1_000)
# One check of a call's arguments against an MCP tool's input schema may take this much thread
# CPU time (ms) and this many keyword steps; past either the call is arguments_too_costly.
ACTHELM_MCP_CHECK_CPU_MS = env_int("ACTHELM_MCP_CHECK_CPU_MS", 100)
ACTHELM_MCP_CHECK_STEPS = env_int("ACTHELM_MCP_CHECK_STEPS", 200_000)
# Input files: each file, and all of a task's files together, at most this many bytes (counted
# while the upload streams; more is refused with a field error).
ACTHELM_INPUT_FILE_MAX_BYTES = env_int("ACTHELM_INPUT_FILE_MAX_BYTES", 25_000_000)
ACTHELM_TASK_INPUTS_MAX_BYTES = env_int("ACTHELM_TASK_INPUTS_MAX_BYTES", 100_000_000)
FILE_UPLOAD_HANDLERS = [
    "tasks.uploads.BoundedUploadHandler",  # counts first; the caps hold while a file streams
    "django.core.files.uploadhandler.MemoryFileUploadHandler",
    "django.core.files.uploadhandler.TemporaryFileUploadHandler",
]

# Operations: /metrics answers only a request with "Authorization: Bearer <this token>"; when it
# is empty, /metrics is switched off (404).
ACTHELM_METRICS_TOKEN = os.environ.get("ACTHELM_METRICS_TOKEN", "").strip()

# ACTHELM_LOG_FORMAT=json: one JSON object per line (core.logging.JsonFormatter).
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {"()": "core.logging.JsonFormatter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": (
                "json"
                if os.environ.get("ACTHELM_LOG_FORMAT", "").strip().lower() == "json"
                else "plain"
            ),
        }
    },
    "root": {"handlers": ["console"], "level": os.environ.get("ACTHELM_LOG_LEVEL", "INFO")},
    # httpx logs every request's full URL at INFO; a webhook URL's path can be its secret.
    "loggers": {"pgserver": {"level": "WARNING"}, "httpx": {"level": "WARNING"}},
}

# Credentials: the names a connection's or tool server's credential_env and a webhook's secret_env
# may take (prefixes; the server's own DJANGO_*, DATABASE_*, POSTGRES_*, PG*, AWS_*, EMAIL_*,
# OTEL_* and ACTHELM_* but ACTHELM_KEY_* are refused even when listed: core.credentials),
# and the executables a model CLI may start (empty: any).
ACTHELM_CREDENTIAL_PREFIXES = env_list(
    "ACTHELM_CREDENTIAL_PREFIXES",
    [
        "ACTHELM_KEY_",
        "OPENAI_API_KEY",
        "ANTHROPIC_API_KEY",
        "OPENROUTER_API_KEY",
        "GEMINI_API_KEY",
        "GOOGLE_API_KEY",
        "MISTRAL_API_KEY",
        "GROQ_API_KEY",
        "DEEPSEEK_API_KEY",
        "TOGETHER_API_KEY",
        "FIREWORKS_API_KEY",
        "XAI_API_KEY",
    ],
)
# Where each credential may go (docs/security.md#credentials): NAME=host[,host…] entries separated
# by ";" — a host, host:port, *.domain (any name below it), an address ([::1] for IPv6) or
# exec:PROGRAM (a model CLI or stdio MCP server whose command[0] is PROGRAM). A credential with no
# entry goes nowhere; the well-known provider keys go to their provider's API host unless listed.
try:
    ACTHELM_CREDENTIAL_DESTINATIONS = dict(WELL_KNOWN_DESTINATIONS) | parse_destinations(
        os.environ.get("ACTHELM_CREDENTIAL_DESTINATIONS", "")
    )
except ValueError as _exc:
    raise ImproperlyConfigured(f"ACTHELM_CREDENTIAL_DESTINATIONS: {_exc}") from None
ACTHELM_CLI_EXECUTABLES = env_list("ACTHELM_CLI_EXECUTABLES", [])
# The executables (command[0], exactly) a person without superuser status may register or change
# as a stdio MCP server's command (empty: stdio servers are for superusers only).
ACTHELM_MCP_EXECUTABLES = env_list("ACTHELM_MCP_EXECUTABLES", [])

# An optional model supervisor on a connection of its own (empty: rule checks only).
ACTHELM_SUPERVISOR_CONNECTION = os.environ.get("ACTHELM_SUPERVISOR_CONNECTION", "")
ACTHELM_SUPERVISOR_MODEL = os.environ.get("ACTHELM_SUPERVISOR_MODEL", "")
# The whole verdict's time budget (acceptance checks and the model supervisor's request); a verdict
# that runs out of it is *unverified* and the task goes to review marked so.
ACTHELM_SUPERVISOR_TIMEOUT_SECONDS = env_float("ACTHELM_SUPERVISOR_TIMEOUT_SECONDS", 120)
# The supervisor's default acceptance checks (agents.engine.verdict.checking.default_checks): a
# named output
# file that was never written, an answer that only repeats the instruction, a run that needed its
# tools and called none, a call of a tool not on the task's list. Measured in docs/eval.md.
ACTHELM_SUPERVISOR_DEFAULT_CHECKS = env_bool("ACTHELM_SUPERVISOR_DEFAULT_CHECKS", True)

# Notifications (tasks.notify). Links in messages point at ACTHELM_BASE_URL.
ACTHELM_BASE_URL = os.environ.get("ACTHELM_BASE_URL", "http://127.0.0.1:8000").strip()
ACTHELM_NOTIFY_TIMEOUT_SECONDS = env_float("ACTHELM_NOTIFY_TIMEOUT_SECONDS", 10)
ACTHELM_NOTIFY_MAX_ATTEMPTS = env_int("ACTHELM_NOTIFY_MAX_ATTEMPTS", 6)
ACTHELM_NOTIFY_RETRY_DELAYS = [
    int(x) for x in env_list("ACTHELM_NOTIFY_RETRY_DELAYS", ["30", "120", "600", "1800", "3600"])
]
# Worker maintenance spends at most about this long per delivery pass (plus one send's timeout).
ACTHELM_NOTIFY_PASS_SECONDS = env_float("ACTHELM_NOTIFY_PASS_SECONDS", 5)
# Addresses or networks (CIDR) a webhook may reach although they are not public: an internal
# receiver must be named here (fetch_url's address policy applies to every other address).
ACTHELM_NOTIFY_ALLOW_ADDRESSES = env_list("ACTHELM_NOTIFY_ALLOW_ADDRESSES", [])
for _entry in ACTHELM_NOTIFY_ALLOW_ADDRESSES:
    try:
        ipaddress.ip_network(_entry, strict=False)
    except ValueError:
        raise ImproperlyConfigured(
            f"ACTHELM_NOTIFY_ALLOW_ADDRESSES: {_entry!r} is not an address or a network (CIDR)"
        ) from None
ACTHELM_NOTIFY_MESSAGE_ID_DOMAIN = os.environ.get("ACTHELM_NOTIFY_MESSAGE_ID_DOMAIN", "acthelm")
# A notification's link to one decision is signed and expires after this many seconds.
ACTHELM_DECISION_LINK_SECONDS = env_int("ACTHELM_DECISION_LINK_SECONDS", 86400)
# Slack targets: the Web API's base URL, and the prefixes a message's response_url may have.
ACTHELM_SLACK_API_URL = os.environ.get("ACTHELM_SLACK_API_URL", "https://slack.com/api").strip()
# Each is matched by scheme, host and port, then path (tasks.notify.slack.response_url_allowed).
ACTHELM_SLACK_RESPONSE_URL_PREFIXES = env_list(
    "ACTHELM_SLACK_RESPONSE_URL_PREFIXES", ["https://hooks.slack.com/"]
)
for _entry in ACTHELM_SLACK_RESPONSE_URL_PREFIXES:
    if urlsplit(_entry).scheme not in ("http", "https") or not urlsplit(_entry).hostname:
        raise ImproperlyConfigured(
            f"ACTHELM_SLACK_RESPONSE_URL_PREFIXES: {_entry!r} is not a URL such as "
            "https://hooks.slack.com/"
        )


# Email (Django's MAILERS): SMTP when EMAIL_HOST is set in the environment, else the console
# backend, which prints each message (development; production uses SMTP on localhost instead).
# The EMAIL_* names are only environment variables here; Django 6.1 reads the mailer's OPTIONS.
def smtp_mailer(host: str) -> dict[str, object]:
    """A MAILERS entry for SMTP from the EMAIL_* environment variables."""
    return {
        "BACKEND": "django.core.mail.backends.smtp.EmailBackend",
        "OPTIONS": {
            "host": host,
            "port": env_int("EMAIL_PORT", 25),
            "username": os.environ.get("EMAIL_HOST_USER", ""),
            "password": os.environ.get("EMAIL_HOST_PASSWORD", ""),
            "use_tls": env_bool("EMAIL_USE_TLS", False),
            "use_ssl": env_bool("EMAIL_USE_SSL", False),
            "timeout": ACTHELM_NOTIFY_TIMEOUT_SECONDS,
        },
    }


EMAIL_HOST_FROM_ENV = os.environ.get("EMAIL_HOST", "").strip()
MAILERS = {
    "default": smtp_mailer(EMAIL_HOST_FROM_ENV)
    if EMAIL_HOST_FROM_ENV
    else {"BACKEND": "django.core.mail.backends.console.EmailBackend"}
}
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "acthelm@localhost")
