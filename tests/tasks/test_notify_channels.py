"""A notification channel is a class registered under its kind: `send()`, the target's
`clean()`, its shown address and the models' choices ask the class, so a channel registered
here, in a test, is offered, checked, shown and sent through with no other file changing and no
migration."""

from typing import ClassVar

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command

from approvals.permissions import DECIDE_APPROVAL
from tasks.notify.channels import (
    MAX_MAIL_LINE_BYTES,
    Channel,
    DeliveryFailed,
    EmailChannel,
    Message,
    WebhookChannel,
    WholeLinesEmail,
    channel_choices,
    channel_kinds,
    get_channel,
    register,
    send,
    unregister,
)
from tasks.notify.models import Notification, NotificationTarget
from tasks.notify.states import TargetKind
from tasks.notify.targets import sample_message, target_add
from tasks.permissions import VIEW_TASK
from tests.factories import UserFactory
from tests.tasks.notify_helpers import approval_notified


class _Chat(Channel):
    """Posts to a chat room named `chat:<room>`; keeps what it sent instead of sending it."""

    kind = "chat_test"
    label = "Chat room"
    address_help = "a chat room, chat:<room>"
    sent: ClassVar[list[tuple[str, str]]] = []

    @classmethod
    def address_problem(cls, address: str) -> str | None:
        return None if address.startswith("chat:") else "a chat target names a room (chat:…)"

    @classmethod
    def shown_address(cls, address: str) -> str:
        return address.split(":", 1)[0] + ":…"

    @classmethod
    def send(cls, target, message: Message) -> str:
        cls.sent.append((target.address, message.subject))
        return "posted"


@pytest.fixture
def chat_channel():
    register(_Chat)
    _Chat.sent.clear()
    yield _Chat
    unregister(_Chat.kind)


def test_the_shipped_channels_are_registered_in_their_order():
    assert channel_kinds() == list(TargetKind)
    assert get_channel(TargetKind.EMAIL) is EmailChannel
    assert get_channel(TargetKind.WEBHOOK) is WebhookChannel
    assert channel_choices() == [
        ("email", "Email"),
        ("webhook", "Webhook (JSON POST)"),
        ("slack", "Slack"),
    ]


@pytest.mark.django_db
def test_a_registered_channel_is_a_choice_of_both_fields_without_a_migration(chat_channel):
    for field in (
        NotificationTarget._meta.get_field("kind"),
        Notification._meta.get_field("channel"),
    ):
        assert ("chat_test", "Chat room") in list(field.choices)
    NotificationTarget(name="team", kind="chat_test", address="chat:ops").full_clean()
    with pytest.raises(ValidationError) as refused:
        NotificationTarget(name="team", kind="pager", address="555").full_clean()
    assert "kind" in refused.value.message_dict
    call_command("makemigrations", "tasks", "--check", "--dry-run", verbosity=0)


def test_send_goes_through_the_registered_channel_of_the_kind(chat_channel):
    target = NotificationTarget(name="team", kind="chat_test", address="chat:ops")
    message = sample_message()
    assert send(target, message) == "posted"
    assert chat_channel.sent == [("chat:ops", message.subject)]
    assert target.shown_address == "chat:…"


def test_a_registered_channel_checks_its_own_addresses_and_refuses_a_secret(chat_channel):
    target = NotificationTarget(
        name="team",
        kind="chat_test",
        address="ops",
        secret_env="ACTHELM_KEY_CHAT",
        events=["failed"],
    )
    with pytest.raises(ValidationError) as refused:
        target.clean()
    assert refused.value.message_dict == {
        "address": ["a chat target names a room (chat:…)"],
        "secret_env": ["only webhooks and Slack name a signing secret"],
    }
    target.address, target.secret_env = "chat:ops", ""
    target.clean()


def test_an_unknown_kind_is_a_clear_delivery_failure():
    target = NotificationTarget(name="gone", kind="pager", address="555")
    with pytest.raises(DeliveryFailed) as failed:
        send(target, sample_message())
    assert (failed.value.code, failed.value.message) == (
        "invalid_target",
        "unknown target kind 'pager'",
    )


def test_a_kind_registers_once():
    class _Another(Channel):
        kind = TargetKind.EMAIL

    with pytest.raises(ValueError, match="already registered by EmailChannel"):
        register(_Another)
    assert get_channel(TargetKind.EMAIL) is EmailChannel


# --- Email: the decision link on one line, in any reader and in the console backend ----------


def _console_body(printed: str) -> list[str]:
    """The body lines of the one email the console backend printed (after the headers)."""
    message = printed.split("-" * 79)[0]
    headers, _, body = message.partition("\n\n")
    assert "Content-Transfer-Encoding: 8bit" in headers.splitlines()
    return body.splitlines()


@pytest.mark.django_db(transaction=True)
def test_the_console_backend_prints_the_decision_link_whole_and_it_opens_the_decision(
    manage, settings, client
):
    """Issue 49, item 4: printed quoted-printable, the link was broken over lines ending in `=`
    and a pasted piece gave link_invalid. A real `acthelm_notify deliver` with the development
    mailer (no EMAIL_HOST: Django's console backend) prints it on one line; it opens the card."""
    settings.ACTHELM_BASE_URL = "http://testserver"
    target_add(name="founder", kind=TargetKind.EMAIL, address="founder@example.org")
    approval = approval_notified()
    [row] = Notification.objects.all()
    assert len(row.url) > 78  # longer than a quoted-printable line

    done = manage("acthelm_notify", "deliver", env={"EMAIL_HOST": ""}, check=True)
    body = _console_body(done.stdout)
    assert row.url in body  # a line of its own, whole
    assert not [line for line in body if line.endswith("=")]
    assert body[0] == row.text  # the readable line, decoded (“…” and —, not =E2=80=9C)

    client.force_login(UserFactory(username="founder", perms=[DECIDE_APPROVAL, VIEW_TASK]))
    pasted = next(line for line in body if line.startswith("http://testserver/decide/"))
    page = client.get(pasted.removeprefix("http://testserver"))
    assert page.status_code == 200
    assert f'id="approval-{approval.pk}"' in page.content.decode()


def test_a_line_too_long_for_a_mail_line_leaves_the_body_to_djangos_encoding():
    fits = WholeLinesEmail(subject="s", body="a—\n" + "x" * MAX_MAIL_LINE_BYTES, to=["a@b.c"])
    assert fits.message()["Content-Transfer-Encoding"] == "8bit"
    too_long = WholeLinesEmail(subject="s", body="y" * (MAX_MAIL_LINE_BYTES + 1), to=["a@b.c"])
    assert too_long.message()["Content-Transfer-Encoding"] != "8bit"
