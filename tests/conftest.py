"""Shared fixtures. Everything runs against real PostgreSQL (embedded unless DATABASE_URL is set).

Django imports stay inside fixtures so that the Django-free provider and tool tests can also run
with `-p no:django`.
"""

import contextlib
import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: Where the suite's own credential names may go (docs/security.md#credentials): the loopback
#: servers and the programs the tests start, and the example hosts some tests save. The
#: well-known provider names (OPENAI_API_KEY, …) keep their defaults, their provider's API host,
#: so tests can prove them refused on loopback; so is any name not listed here.
TEST_CREDENTIAL_NAMES = [
    "ACTHELM_KEY_TEST",
    "ACTHELM_KEY_TEST_HOOK",
    "ACTHELM_KEY_SCRIPTED",
    "ACTHELM_KEY_VLLM",
    "ACTHELM_KEY_OLLAMA",
    "ACTHELM_KEY_LOCAL",
    "ACTHELM_KEY_ONE",
    "ACTHELM_KEY_OTHER",
    "ACTHELM_KEY_MINE",
    "ACTHELM_KEY_CHAT",
    "ACTHELM_KEY_HOOK",
    "ACTHELM_KEY_HOOK_SIGNING",
    "ACTHELM_KEY_SLACK_BOT",
    "ACTHELM_KEY_SLACK_SIGNING",
    "ACTHELM_KEY_NOT_SET_ANYWHERE",
    "MCP_TEST_TOKEN",
]
TEST_CREDENTIAL_HOSTS = [
    "127.0.0.1",
    "localhost",
    "[::1]",
    "hooks.example.org",
    "x.example.org",
    f"exec:{sys.executable}",
    f"exec:{shutil.which('env') or '/usr/bin/env'}",
]
TEST_CREDENTIAL_DESTINATIONS = ";".join(
    f"{name}={','.join(TEST_CREDENTIAL_HOSTS)}" for name in TEST_CREDENTIAL_NAMES
)
# Child processes (workers, commands) read it from their environment.
os.environ["ACTHELM_CREDENTIAL_DESTINATIONS"] = TEST_CREDENTIAL_DESTINATIONS


@pytest.fixture(autouse=True)
def _credential_destinations(request):
    """The suite's destinations in this process too (the settings may have been read before
    this file set the variable)."""
    if not _django_active(request):
        return
    from core.credentials import WELL_KNOWN_DESTINATIONS, parse_destinations

    settings = request.getfixturevalue("settings")
    settings.ACTHELM_CREDENTIAL_DESTINATIONS = dict(WELL_KNOWN_DESTINATIONS) | parse_destinations(
        TEST_CREDENTIAL_DESTINATIONS
    )


@pytest.fixture(scope="session", autouse=True)
def _fast_password_hashing(request):
    """The factories set a password on every user they make, and the deployed hasher (PBKDF2,
    1.5 million rounds) costs ~0.65 s of CPU each: a quarter of the suite's CPU went there. Tests
    hash with MD5; PBKDF2 stays in the list, so a hash a child process (a command, a server)
    made still checks here."""
    if not _django_active(request):
        yield
        return
    from django.conf import settings
    from django.test.utils import override_settings

    fast = override_settings(
        PASSWORD_HASHERS=[
            "django.contrib.auth.hashers.MD5PasswordHasher",
            *(h for h in settings.PASSWORD_HASHERS if not h.endswith("MD5PasswordHasher")),
        ]
    )
    fast.enable()
    yield
    fast.disable()


@pytest.fixture(autouse=True)
def _media_root(request, tmp_path_factory):
    """Each test gets its own media root for task workspaces and artifacts."""
    if not _django_active(request):
        yield None
        return
    settings = request.getfixturevalue("settings")
    media = tmp_path_factory.mktemp("media")
    settings.ACTHELM_MEDIA_ROOT = media
    yield media


def _django_active(request) -> bool:
    return request.config.pluginmanager.hasplugin("django")


@pytest.fixture
def person(db):
    from tests.factories import UserFactory

    return UserFactory(
        username="founder",
        perms=[
            "tasks.close_task",
            "tasks.operate_task",
            "approvals.decide_approval",
            "agents.manage_connections",
            "tasks.view_task",
            "tasks.change_task",
        ],
    )


@pytest.fixture
def actor(person):
    from core.actors import Actor

    return Actor.person(person)


@pytest.fixture
def outsider(db):
    """A staff user with view rights and no right to act."""
    from tests.factories import UserFactory

    return UserFactory(username="viewer", perms=["tasks.view_task"])


@pytest.fixture
def worker_env(transactional_db, _media_root):
    """Environment for a child process (a worker, a command) that must use the test database
    and the test's own media root: task ids repeat across tests and across the suite's
    processes, so a shared folder would hand one test's workspace and artifacts to another."""
    from django.db import connection

    from core.dburl import build_database_url

    env = dict(os.environ)
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)  # set for Playwright's thread only, never children
    env["DATABASE_URL"] = build_database_url(connection.settings_dict)
    env["PYTHONPATH"] = str(ROOT)
    env["DJANGO_SETTINGS_MODULE"] = "acthelm_site.settings"
    env["PYTHONUNBUFFERED"] = "1"
    env["ACTHELM_MEDIA_ROOT"] = str(_media_root)
    return env


@pytest.fixture
def manage_process(worker_env):
    """Run `manage.py ARGS` in a child process against the test database: for what only a real
    process shows (its exit status to a shell, settings read from its environment)."""
    import subprocess

    def run(*args, env=None, timeout=60, check=False):
        result = subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), *args],
            env={**worker_env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"manage.py {' '.join(args)} failed:\n{result.stderr}")
        return result

    return run


@pytest.fixture
def manage(worker_env, manage_process):
    """Run `manage.py ARGS` against the test database, as the child process would, but inside
    this one: the command parses the same argv (`run_from_argv`), writes to stdout and stderr
    (its log lines too), and its exit status is what `sys.exit` would give the shell; an
    exception it does not catch is a traceback on stderr and status 1. A child process costs
    some 2 s of CPU to start Django; the suite ran some hundreds of them. With `env`, the
    command runs in a real child process (settings read the environment at start-up)."""
    import io
    import logging
    import subprocess
    import traceback

    from django.core.management import get_commands, load_command_class

    def run(*args, env=None, timeout=60, check=False):
        if env:
            return manage_process(*args, env=env, timeout=timeout, check=check)
        out, err = io.StringIO(), io.StringIO()
        # Django's logging handler writes to the stderr of the process that configured it.
        consoles = [h for h in logging.getLogger().handlers if h.get_name() == "console"]
        streams = [h.setStream(err) for h in consoles]  # type: ignore[attr-defined]
        code = 0
        try:
            with (
                contextlib.redirect_stdout(out),
                contextlib.redirect_stderr(err),
                _stdin(io.StringIO()),
            ):
                command = load_command_class(get_commands()[args[0]], args[0])
                try:
                    command.run_from_argv([str(ROOT / "manage.py"), *args])
                except SystemExit as exit_:
                    code = exit_.code if isinstance(exit_.code, int) else (exit_.code is not None)
                    if isinstance(exit_.code, str):
                        err.write(exit_.code + "\n")
                except Exception:  # noqa: BLE001 - what Python prints, and exits 1
                    err.write(traceback.format_exc())
                    code = 1
        finally:
            for handler, stream in zip(consoles, streams, strict=True):
                handler.setStream(stream)  # type: ignore[attr-defined]
        result = subprocess.CompletedProcess(
            ["manage.py", *args], int(code), out.getvalue(), err.getvalue()
        )
        if check and result.returncode != 0:
            raise AssertionError(f"manage.py {' '.join(args)} failed:\n{result.stderr}")
        return result

    return run


@contextlib.contextmanager
def _stdin(stream):
    """The child process's stdin as `subprocess.run` left it: nothing to read."""
    saved, sys.stdin = sys.stdin, stream
    try:
        yield
    finally:
        sys.stdin = saved
