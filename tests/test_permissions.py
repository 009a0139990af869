"""Each permission's name is written once, in the permissions module of the app whose models
declare it; every other module imports it from there."""

import re
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission

from agents import permissions as agent_perms
from approvals import permissions as approval_perms
from schedules import permissions as schedule_perms
from tasks import permissions as task_perms

ROOT = Path(__file__).resolve().parent.parent
MODULES = (task_perms, approval_perms, agent_perms, schedule_perms)
# A permission's name as a string literal: "tasks.close_task", "agents.view_connection".
LITERAL = re.compile(
    r"""["'](?:tasks|approvals|agents|schedules)\.(?:view|add|change|delete|operate|close|decide|manage)_"""
)
APP_CODE = (
    "acthelm_site",
    "agents",
    "approvals",
    "console",
    "core",
    "memory",
    "schedules",
    "tasks",
)


def _names() -> dict[str, str]:
    return {
        f"{module.__name__}.{name}": value
        for module in MODULES
        for name, value in vars(module).items()
        if name.isupper() and isinstance(value, str)
    }


@pytest.mark.django_db
def test_every_name_is_a_permission_the_models_declare():
    known = {
        f"{app}.{codename}"
        for app, codename in Permission.objects.values_list("content_type__app_label", "codename")
    }
    assert _names(), "no permission names found"
    for where, name in _names().items():
        assert name in known, f"{where} = {name!r} is no permission"
        app = name.partition(".")[0]
        assert where.startswith(f"{app}.permissions."), f"{name} is named outside its app"
    assert set(approval_perms.INBOX_PERMS) <= set(_names().values())
    assert set(agent_perms.VIEW_CONNECTIONS_PERMS) <= set(_names().values())


def test_the_names_are_written_only_in_the_permissions_modules():
    spelled = []
    for package in APP_CODE:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if "/migrations/" in relative or relative.endswith("/permissions.py"):
                continue
            for number, line in enumerate(path.read_text().splitlines(), start=1):
                if LITERAL.search(line):
                    spelled.append(f"{relative}:{number}: {line.strip()}")
    assert spelled == []
