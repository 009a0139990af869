"""What the console keeps about the people who use it from elsewhere: a person's Slack user id
(set by an operator on the person's admin page) and the Slack requests already answered."""

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models


class SlackIdentity(models.Model):
    """The Slack user who is this person. Set by an operator, never guessed from a display name:
    a Slack button decides as the person this row names."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="slack_identity"
    )
    slack_user_id = models.CharField(
        "Slack user id",
        max_length=32,
        unique=True,
        validators=[
            RegexValidator(r"^[UW][A-Z0-9]{2,30}$", "a Slack user id looks like U0123ABCD")
        ],
        help_text="The member id from the person's Slack profile (⋮ → Copy member ID), e.g. "
        "U0123ABCD. Their clicks on Approve / Deny decide as this person.",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "Slack user"

    def __str__(self) -> str:
        return f"{self.slack_user_id} → {self.user}"


class SlackRequestSeen(models.Model):
    """The signature of each Slack request the console accepted. A request that arrives twice
    (a replay within Slack's 300 s window, a duplicate) finds its row and decides nothing;
    rows older than the window are useless and are deleted as new ones arrive."""

    signature = models.CharField(max_length=100, unique=True)
    seen_at = models.DateTimeField(auto_now_add=True, db_index=True)

    def __str__(self) -> str:
        return f"{self.signature[:20]}… at {self.seen_at:%Y-%m-%d %H:%M:%S}"
