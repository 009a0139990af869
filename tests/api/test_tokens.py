"""API tokens: stored only as a hash, shown once, refused once revoked, use recorded."""

import hashlib

import pytest
from django.db import connection

from acthelm_site.api.models import ApiToken
from acthelm_site.api.tokens import (
    TokenNotFound,
    TokenRefused,
    token_authenticate,
    token_create,
    token_find,
    token_revoke,
)
from core.exceptions import InvalidInput, TransitionNotAllowed
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def user():
    return UserFactory(username="ops")


def test_only_a_hash_of_the_token_is_stored(user):
    new = token_create(user=user, name="ci")
    assert new.secret.startswith(f"acthelm_{new.token.prefix}_")
    assert len(new.secret) >= 8 + 8 + 1 + 43
    token = ApiToken.objects.get()
    assert token.secret_hash == hashlib.sha256(new.secret.encode()).hexdigest()
    # The secret is URL-safe base64, which may itself hold "_": everything after the prefix.
    secret_part = new.secret.removeprefix(f"acthelm_{new.token.prefix}_")
    assert len(secret_part) >= 43
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM api_apitoken")
        row = " ".join(str(v) for v in cursor.fetchone())
    assert secret_part not in row and new.secret not in row
    assert new.secret not in str(token) and token.display.endswith("_…")


def test_the_token_authenticates_its_person(user):
    new = token_create(user=user, name="ci")
    assert token_authenticate(new.secret).user == user
    assert token_authenticate(f"  {new.secret} ").pk == new.token.pk


@pytest.mark.parametrize(
    "raw", ["", "acthelm_", "Bearer x", "acthelm_deadbeef_" + "A" * 43, "ghp_" + "x" * 36]
)
def test_anything_else_is_refused(user, raw):
    token_create(user=user, name="ci")
    with pytest.raises(TokenRefused) as refused:
        token_authenticate(raw)
    assert refused.value.code == "token_invalid"


def test_an_altered_token_is_refused(user):
    new = token_create(user=user, name="ci")
    altered = new.secret[:-1] + ("A" if new.secret[-1] != "A" else "B")
    with pytest.raises(TokenRefused):
        token_authenticate(altered)


def test_a_revoked_token_is_refused_and_cannot_be_revoked_again(user):
    new = token_create(user=user, name="ci")
    token_revoke(token_id=new.token.pk)
    with pytest.raises(TokenRefused) as refused:
        token_authenticate(new.secret)
    assert refused.value.code == "token_revoked"
    with pytest.raises(TransitionNotAllowed):
        token_revoke(token_id=new.token.pk)
    with pytest.raises(TokenNotFound):
        token_revoke(token_id=999999)


def test_a_name_is_unique_among_a_persons_live_tokens(user):
    first = token_create(user=user, name="ci")
    with pytest.raises(InvalidInput) as refused:
        token_create(user=user, name="ci")
    assert refused.value.field == "name"
    token_revoke(token_id=first.token.pk)
    assert token_create(user=user, name="ci").token.pk != first.token.pk
    assert token_create(user=UserFactory(username="other"), name="ci")


@pytest.mark.parametrize("name", ["", "   ", "x" * 101])
def test_a_token_needs_a_name(user, name):
    with pytest.raises(InvalidInput):
        token_create(user=user, name=name)


def test_an_inactive_person_gets_no_token():
    with pytest.raises(InvalidInput):
        token_create(user=UserFactory(username="left", is_active=False), name="ci")


def test_tokens_are_found_by_prefix_only(user):
    new = token_create(user=user, name="ci")
    for ref in (new.token.prefix, new.token.display, f"acthelm_{new.token.prefix}"):
        assert token_find(ref).pk == new.token.pk
    for ref in ("ffffffff", str(new.token.pk), ""):
        with pytest.raises(TokenNotFound):
            token_find(ref)


def test_an_all_digit_prefix_never_finds_another_token_by_its_id(user):
    """Issue 21 item 11: revoking `acthelm_token revoke 00000042` revoked token 42."""
    other = token_create(user=user, name="other").token
    digits = token_create(user=user, name="digits").token
    ApiToken.objects.filter(pk=digits.pk).update(prefix=f"{other.pk:08d}")
    assert token_find(f"{other.pk:08d}").pk == digits.pk
    assert token_find(other.prefix).pk == other.pk


# -- who may hold a token (issue 21 item 5) ------------------------------------------------------


def test_only_the_person_or_a_superuser_creates_a_token_for_a_person(user):
    from core.exceptions import NotPermitted

    clerk = UserFactory(username="clerk")
    with pytest.raises(NotPermitted):
        token_create(user=user, name="ci", created_by=clerk)
    assert token_create(user=clerk, name="ci", created_by=clerk).token.user == clerk
    root = UserFactory(username="root", is_superuser=True)
    assert token_create(user=user, name="ci", created_by=root).token.user == user


def test_a_person_who_is_not_staff_gets_no_token():
    with pytest.raises(InvalidInput) as refused:
        token_create(user=UserFactory(username="guest", is_staff=False), name="ci")
    assert refused.value.code == "token_holder_not_eligible"
    assert refused.value.http_status == 400  # the input is refused, not a token


@pytest.mark.parametrize("change", [{"is_staff": False}, {"is_active": False}])
def test_a_token_stops_working_when_its_person_loses_staff_status_or_leaves(user, change):
    new = token_create(user=user, name="ci")
    assert token_authenticate(new.secret).user == user
    type(user).objects.filter(pk=user.pk).update(**change)
    with pytest.raises(TokenRefused):
        token_authenticate(new.secret)


def test_replace_revokes_the_live_token_of_that_name_and_issues_a_new_one(user):
    """A script that creates its token runs twice (issue 49, item 7): the old token stops."""
    first = token_create(user=user, name="laptop", replace=True)
    assert first.replaced is None
    second = token_create(user=user, name="laptop", replace=True)
    assert second.replaced is not None and second.replaced.pk == first.token.pk
    with pytest.raises(TokenRefused):
        token_authenticate(first.secret)
    assert token_authenticate(second.secret).pk == second.token.pk
    assert ApiToken.objects.filter(user=user, name="laptop", revoked_at__isnull=True).count() == 1
    other = token_create(user=user, name="ci", replace=True)  # another name: untouched
    assert other.replaced is None and token_authenticate(second.secret)
