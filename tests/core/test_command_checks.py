"""The `acthelm_*` commands run Django's system checks before their work, all but the URLconf's
(core/commands.py): a command that serves no page does not import every view to start. Only
`check`, `migrate` and `runserver` run the untagged ones (Django runs those only when no tag is
asked for)."""

from io import StringIO

import pytest
from django.core import checks
from django.core.management import call_command, get_commands, load_command_class
from django.core.management.base import SystemCheckError

from core.commands import CHECKS, PROJECT_TAG


def test_every_acthelm_command_runs_every_check_but_the_urlconfs():
    names = sorted(name for name in get_commands() if name.startswith("acthelm_"))
    assert len(names) >= 13
    every = {tag for name, tag in vars(checks.Tags).items() if not name.startswith("_")}
    assert set(CHECKS) == every - {checks.Tags.urls} | {PROJECT_TAG}
    for name in names:
        command = load_command_class(get_commands()[name], name)
        assert command.requires_system_checks == CHECKS, name


def test_every_registered_tagged_check_but_the_urlconfs_is_one_a_command_runs():
    """A check registered under a tag CHECKS lacks would never run before a command."""
    registered = checks.registry.registry.get_checks(include_deployment_checks=True)
    tagged = [check for check in registered if check.tags]
    assert any(PROJECT_TAG in check.tags for check in tagged)  # agents/checks.py
    for check in tagged:
        assert set(check.tags) & set(CHECKS) or set(check.tags) == {checks.Tags.urls}, check


@pytest.fixture
def failing_check():
    """A check that fails, registered under a tag the test chooses; removed afterwards."""
    registered = []

    def register(tag: str) -> None:
        def broken(app_configs, **kwargs):
            return [checks.Error("broken on purpose", id="tests.E001")]

        checks.register(broken, tag)
        registered.append(broken)

    yield register
    for check in registered:
        checks.registry.registry.registered_checks.discard(check)


def test_a_failing_model_check_still_stops_a_command(failing_check, db):
    failing_check(checks.Tags.models)
    with pytest.raises(SystemCheckError, match="broken on purpose"):
        call_command("acthelm_recover", "--json", skip_checks=False, stdout=StringIO())


def test_a_failing_url_check_does_not_stop_a_command_and_still_stops_check(failing_check, db):
    failing_check(checks.Tags.urls)
    call_command("acthelm_recover", "--json", skip_checks=False, stdout=StringIO())
    with pytest.raises(SystemCheckError, match="broken on purpose"):
        call_command("check", stdout=StringIO())
