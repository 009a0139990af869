"""Per-person API tokens. Only a SHA-256 of each token is stored; the token itself is shown once,
when it is created. A token acts with its person's permissions, no more."""

from django.conf import settings
from django.db import models
from django.db.models import Q


class ApiToken(models.Model):
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=100, help_text="What the token is for, e.g. 'ci'.")
    # The token's first characters after "acthelm_": not secret, shown in lists and logs.
    prefix = models.CharField(max_length=16, unique=True, editable=False)
    secret_hash = models.CharField(max_length=64, unique=True, editable=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        editable=False,
    )
    created_at = models.DateTimeField(auto_now_add=True)
    # Recorded at most once a minute per token, so a busy script does not rewrite the row on
    # every request.
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["-id"]
        verbose_name = "API token"
        constraints = [
            models.UniqueConstraint(
                fields=["user", "name"],
                condition=Q(revoked_at__isnull=True),
                name="api_token_live_name_unique",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.display})"

    @property
    def display(self) -> str:
        return f"acthelm_{self.prefix}_…"

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None
