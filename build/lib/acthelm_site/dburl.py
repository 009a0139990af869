"""Turn DATABASE_URL into Django's DATABASES entry (postgres only)."""

from urllib.parse import parse_qs, unquote, urlsplit


def parse_database_url(url: str) -> dict:
    parts = urlsplit(url)
    if parts.scheme not in ("postgres", "postgresql", "pgsql"):
        raise ValueError(f"DATABASE_URL must be a postgresql:// URL, not {parts.scheme!r}")
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
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


def build_database_url(settings_dict: dict) -> str:
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
