"""Turn DATABASE_URL into Django's DATABASES entry (postgres only), and a DATABASES entry into a
libpq connection string for the connections Django does not open (the worker's LISTEN)."""

from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

#: Keys of a DATABASES entry's OPTIONS that configure Django or psycopg, not the libpq connection.
DJANGO_OPTIONS = frozenset(
    {
        "pool",
        "isolation_level",
        "server_side_binding",
        "assume_role",
        "prepare_threshold",
        "cursor_factory",
        "context",
    }
)


def _typed_option(key: str, value: str, name: str) -> Any:
    """A URL's query gives text; the options psycopg and Django read as numbers or booleans get
    their type here (`?prepare_threshold=1` would otherwise reach psycopg as "1" and fail the
    first statement it counts)."""
    if key == "prepare_threshold":
        if value.strip().lower() in ("", "none"):
            return None  # never prepare (what a transaction-mode pooler needs)
        try:
            threshold = int(value)
        except ValueError:
            raise ValueError(
                f"{name}: prepare_threshold must be a whole number or 'none', not {value!r}"
            ) from None
        if threshold < 0:
            raise ValueError(f"{name}: prepare_threshold must be 0 or more, not {threshold}")
        return threshold
    if key == "server_side_binding":
        flag = value.strip().lower()
        if flag not in ("true", "false", "1", "0", "on", "off", "yes", "no"):
            raise ValueError(f"{name}: server_side_binding must be true or false, not {value!r}")
        return flag in ("true", "1", "on", "yes")
    return value


def parse_database_url(url: str, *, name: str = "DATABASE_URL") -> dict[str, Any]:
    parts = urlsplit(url)
    if parts.scheme not in ("postgres", "postgresql", "pgsql"):
        raise ValueError(f"{name} must be a postgresql:// URL, not {parts.scheme!r}")
    query: dict[str, Any] = {
        k: _typed_option(k, v[-1], name) for k, v in parse_qs(parts.query).items()
    }
    host = query.pop("host", None) or unquote(parts.hostname or "")
    port = query.pop("port", None) or (str(parts.port) if parts.port else "")
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")) or "postgres",
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": host,
        "PORT": port,
        "OPTIONS": query,
    }


def build_database_url(settings_dict: dict[str, Any]) -> str:
    """The inverse, for handing the current (e.g. test) database to a child process."""
    from urllib.parse import quote, urlencode

    user = quote(settings_dict.get("USER") or "")
    password = quote(settings_dict.get("PASSWORD") or "")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = settings_dict.get("HOST") or ""
    port = str(settings_dict.get("PORT") or "")
    query = dict(settings_dict.get("OPTIONS") or {})
    if host.startswith("/"):
        query["host"] = host
        if port:
            query["port"] = port
        netloc = auth
    else:
        netloc = auth + host + (f":{port}" if port else "")
    qs = ("?" + urlencode(query)) if query else ""
    return f"postgresql://{netloc}/{quote(settings_dict['NAME'])}{qs}"


def libpq_conninfo(settings_dict: dict[str, Any], **overrides: str) -> str:
    """A libpq connection string for a DATABASES entry (or `parse_database_url`'s result) with
    every libpq option of it (sslmode, sslrootcert, options, connect_timeout, …); only Django's
    own options (the pool, the isolation level, …) are left out. `overrides` win."""
    from psycopg.conninfo import make_conninfo

    params = {
        key: value
        for key, value in (settings_dict.get("OPTIONS") or {}).items()
        if key not in DJANGO_OPTIONS
    }
    for key, setting in (
        ("dbname", "NAME"),
        ("user", "USER"),
        ("password", "PASSWORD"),
        ("host", "HOST"),
        ("port", "PORT"),
    ):
        if settings_dict.get(setting):
            params[key] = settings_dict[setting]
    params.update(overrides)
    return make_conninfo(**{k: str(v) for k, v in params.items() if v not in (None, "")})


def listen_conninfo(url: str, default: dict[str, Any], *, application_name: str) -> str:
    """The worker's LISTEN connection: `url` (ACTHELM_LISTEN_DATABASE_URL) when set, else the
    default database's entry (DATABASE_URL, or the embedded server), every option kept."""
    source = parse_database_url(url, name="ACTHELM_LISTEN_DATABASE_URL") if url else default
    return libpq_conninfo(source, application_name=application_name)
