"""Shared fixtures. Everything runs against real PostgreSQL (embedded unless DATABASE_URL is set).

Django imports stay inside fixtures so that the Django-free provider and tool tests can also run
with `-p no:django`.
"""

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


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
    from tasks.actors import Actor

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

    from acthelm_site.dburl import build_database_url

    env = dict(os.environ)
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)  # set for Playwright's thread only, never children
    env["DATABASE_URL"] = build_database_url(connection.settings_dict)
    env["PYTHONPATH"] = str(ROOT)
    env["DJANGO_SETTINGS_MODULE"] = "acthelm_site.settings"
    env["PYTHONUNBUFFERED"] = "1"
    env["ACTHELM_MEDIA_ROOT"] = str(_media_root)
    return env


@pytest.fixture
def manage(worker_env):
    """Run `manage.py ARGS` in a child process against the test database."""
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
