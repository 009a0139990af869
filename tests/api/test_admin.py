"""API tokens in the admin: the token is shown once, on the page that answers the creation."""

import pytest
from django.test import Client

from acthelm_site.api.models import ApiToken
from acthelm_site.api.tokens import token_authenticate, token_create
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

ADD = "/admin/api/apitoken/add/"
LIST = "/admin/api/apitoken/"


@pytest.fixture
def admin_client():
    client = Client()
    client.force_login(UserFactory(username="root", is_superuser=True))
    return client


def test_creating_a_token_shows_it_once(admin_client):
    owner = UserFactory(username="alice")
    response = admin_client.post(ADD, {"user": owner.pk, "name": "laptop"})
    assert response.status_code == 200 and "no-store" in response["Cache-Control"]
    page = response.content.decode()
    token = ApiToken.objects.get()
    start = page.index('id="api-token"')
    secret = page[page.index(">", start) + 1 : page.index("</code>", start)]
    assert secret.startswith(f"acthelm_{token.prefix}_")
    assert token_authenticate(secret).user == owner
    assert token.created_by.username == "root"
    # Never again: neither the list nor the token's own page shows it.
    assert secret not in admin_client.get(LIST).content.decode()
    assert secret not in admin_client.get(f"{LIST}{token.pk}/change/").content.decode()


def test_a_duplicate_live_name_is_refused_in_the_form(admin_client):
    owner = UserFactory(username="bob")
    token_create(user=owner, name="ci")
    response = admin_client.post(ADD, {"user": owner.pk, "name": "ci"})
    assert response.status_code == 200 and ApiToken.objects.count() == 1
    assert "errornote" in response.content.decode()


def test_the_revoke_action(admin_client):
    new = token_create(user=UserFactory(username="carol"), name="ci")
    response = admin_client.post(
        LIST, {"action": "revoke", "_selected_action": [new.token.pk]}, follow=True
    )
    assert "1 token(s) revoked." in response.content.decode()
    new.token.refresh_from_db()
    assert new.token.revoked_at is not None


def test_tokens_are_not_deleted_but_revoked(admin_client):
    new = token_create(user=UserFactory(username="dave"), name="ci")
    assert admin_client.get(f"{LIST}{new.token.pk}/delete/").status_code == 403


# -- who may create a token for whom (issue 21 item 5) ------------------------------------------


@pytest.fixture
def token_clerk():
    """A staff user holding only add/view API token."""
    clerk = UserFactory(username="clerk", perms=["api.add_apitoken", "api.view_apitoken"])
    client = Client()
    client.force_login(clerk)
    client.user = clerk
    return client


def test_a_staff_user_cannot_create_a_token_for_a_superuser(token_clerk):
    root = UserFactory(username="boss", is_superuser=True)
    response = token_clerk.post(ADD, {"user": root.pk, "name": "mine-now"})
    assert response.status_code == 200  # the form again: boss is not a choice
    assert response.context["adminform"].form.errors["user"]
    assert not ApiToken.objects.exists()


def test_a_staff_user_creates_a_token_for_themselves(token_clerk):
    response = token_clerk.post(ADD, {"user": token_clerk.user.pk, "name": "laptop"})
    assert response.status_code == 200 and "api-token" in response.content.decode()
    assert ApiToken.objects.get().user == token_clerk.user


def test_a_superuser_creates_tokens_for_staff_only(admin_client):
    outsider = UserFactory(username="outsider", is_staff=False)
    response = admin_client.post(ADD, {"user": outsider.pk, "name": "ci"})
    assert response.status_code == 200 and not ApiToken.objects.exists()
    assert response.context["adminform"].form.errors["user"]
