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
