"""The person's admin page shows and sets their Slack user id: the only way a Slack click maps
to a person."""

import pytest

from console.models import SlackIdentity
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

INLINE = "slack_identity"


def form_data(user, slack_user_id: str) -> dict[str, str]:
    return {
        "username": user.username,
        "email": user.email,
        "first_name": "",
        "last_name": "",
        "is_active": "on",
        "is_staff": "on",
        "date_joined_0": "2026-01-01",
        "date_joined_1": "00:00:00",
        "last_login_0": "",
        "last_login_1": "",
        f"{INLINE}-TOTAL_FORMS": "1",
        f"{INLINE}-INITIAL_FORMS": "0",
        f"{INLINE}-MIN_NUM_FORMS": "0",
        f"{INLINE}-MAX_NUM_FORMS": "1",
        f"{INLINE}-0-slack_user_id": slack_user_id,
        f"{INLINE}-0-user": str(user.pk),
    }


def test_an_operator_sets_the_slack_user_id_on_the_persons_page(admin_client):
    alice = UserFactory(username="alice")
    page = admin_client.get(f"/admin/auth/user/{alice.pk}/change/").content.decode()
    assert "Slack user id" in page and f"{INLINE}-0-slack_user_id" in page
    response = admin_client.post(
        f"/admin/auth/user/{alice.pk}/change/", form_data(alice, "U0ALICE")
    )
    assert response.status_code == 302, response.content.decode()[:3000]
    assert SlackIdentity.objects.get(user=alice).slack_user_id == "U0ALICE"
    listing = admin_client.get("/admin/auth/user/?q=U0ALICE").content.decode()
    assert "U0ALICE" in listing and "alice" in listing


def test_a_malformed_or_taken_slack_user_id_is_refused(admin_client):
    alice, bob = UserFactory(username="alice"), UserFactory(username="bob")
    SlackIdentity.objects.create(user=bob, slack_user_id="U0BOB")
    for bad in ("alice", "U0BOB"):
        response = admin_client.post(f"/admin/auth/user/{alice.pk}/change/", form_data(alice, bad))
        assert response.status_code == 200
    assert not SlackIdentity.objects.filter(user=alice).exists()
