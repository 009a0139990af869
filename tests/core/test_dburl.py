"""DATABASE_URL → DATABASES, and a DATABASES entry → the worker's LISTEN connection string."""

import pytest
from psycopg.conninfo import conninfo_to_dict

from core.dburl import libpq_conninfo, listen_conninfo, parse_database_url

TLS_URL = (
    "postgresql://acthelm:s%40cret@db.example.com:6543/acthelm"
    "?sslmode=verify-full&sslrootcert=/etc/ssl/db-ca.pem&connect_timeout=7"
    "&options=-c%20statement_timeout%3D5s&target_session_attrs=read-write"
)


def test_the_listener_keeps_every_option_of_its_url():
    """A server that requires TLS gets a TLS listener: sslmode, sslrootcert, options and
    connect_timeout reach libpq, not only the name, user, password, host and port."""
    pooler = parse_database_url("postgresql://x@pooler/other")
    params = conninfo_to_dict(
        listen_conninfo(TLS_URL, pooler, application_name="acthelm-listen w1")
    )
    assert params == {
        "dbname": "acthelm",
        "user": "acthelm",
        "password": "s@cret",
        "host": "db.example.com",
        "port": "6543",
        "sslmode": "verify-full",
        "sslrootcert": "/etc/ssl/db-ca.pem",
        "connect_timeout": "7",
        "options": "-c statement_timeout=5s",
        "target_session_attrs": "read-write",
        "application_name": "acthelm-listen w1",
    }


def test_without_a_listen_url_the_listener_uses_the_default_database_and_its_options():
    """The default entry as the worker has it: Django's own options (the pool a worker process
    configures, the isolation level) are not libpq's and stay out; the rest is kept, and the
    listener's application_name replaces the pool's."""
    default = parse_database_url(
        "postgresql://acthelm@10.0.0.5/acthelm?sslmode=require&connect_timeout=3"
        "&options=-c%20search_path%3Dacthelm"
    )
    default["OPTIONS"].update(
        pool={"min_size": 1, "max_size": 4},
        isolation_level=1,
        server_side_binding=False,
        application_name="acthelm-worker w1",
    )
    params = conninfo_to_dict(listen_conninfo("", default, application_name="acthelm-listen w1"))
    assert params == {
        "dbname": "acthelm",
        "user": "acthelm",
        "host": "10.0.0.5",
        "sslmode": "require",
        "connect_timeout": "3",
        "options": "-c search_path=acthelm",
        "application_name": "acthelm-listen w1",
    }


def test_a_unix_socket_url_keeps_its_folder_and_port():
    """The embedded server's form (host and port in the query)."""
    params = conninfo_to_dict(
        libpq_conninfo(parse_database_url("postgresql://postgres@/acthelm?host=/srv/pg&port=5433"))
    )
    assert params == {"dbname": "acthelm", "user": "postgres", "host": "/srv/pg", "port": "5433"}


def test_a_listen_url_that_is_not_postgresql_is_refused_by_its_name():
    with pytest.raises(ValueError, match="ACTHELM_LISTEN_DATABASE_URL must be a postgresql://"):
        listen_conninfo("mysql://db/acthelm", {}, application_name="x")


def test_the_options_psycopg_reads_as_numbers_or_flags_get_their_type():
    """`?prepare_threshold=1` reaches psycopg as the number 1 (as text it fails the first
    statement psycopg counts), `none` as None (never prepare, for a transaction-mode pooler);
    `server_side_binding` as a boolean; every other option stays text for libpq."""
    options = parse_database_url(
        "postgresql://u@h/db?prepare_threshold=1&server_side_binding=true&connect_timeout=7"
    )["OPTIONS"]
    assert options == {"prepare_threshold": 1, "server_side_binding": True, "connect_timeout": "7"}
    none = parse_database_url("postgresql://u@h/db?prepare_threshold=None&server_side_binding=0")
    assert none["OPTIONS"] == {"prepare_threshold": None, "server_side_binding": False}


@pytest.mark.parametrize(
    "query, message",
    [
        ("prepare_threshold=often", "prepare_threshold must be a whole number or 'none'"),
        ("prepare_threshold=-1", "prepare_threshold must be 0 or more"),
        ("server_side_binding=maybe", "server_side_binding must be true or false"),
    ],
)
def test_a_typed_option_that_is_not_its_type_is_refused_by_the_urls_name(query, message):
    with pytest.raises(ValueError, match=f"ACTHELM_LISTEN_DATABASE_URL: {message}"):
        parse_database_url(f"postgresql://u@h/db?{query}", name="ACTHELM_LISTEN_DATABASE_URL")


def test_a_url_that_asks_for_prepared_statements_gets_them(db):
    """The parsed option works as psycopg's: a statement run twice on a connection opened with
    `?prepare_threshold=1` is prepared at the server (the step's one statement, for a worker
    connected straight to PostgreSQL)."""
    import psycopg
    from django.db import connection

    from core.dburl import build_database_url

    settings = parse_database_url(build_database_url(connection.settings_dict))
    url_settings = parse_database_url(
        build_database_url({**settings, "OPTIONS": {**settings["OPTIONS"], "prepare_threshold": 1}})
    )
    threshold = url_settings["OPTIONS"]["prepare_threshold"]
    assert threshold == 1
    with psycopg.connect(libpq_conninfo(url_settings), prepare_threshold=threshold) as conn:
        for _ in range(3):
            conn.execute("SELECT %s::int + 1", [1]).fetchone()
        prepared = conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()
    assert prepared == (1,)
