"""Who acts on a task: a person, a worker, or the system itself. Every event names one."""

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import models

from core.exceptions import NotPermitted

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser, User


class ActorKind(models.TextChoices):
    PERSON = "person", "Person"
    WORKER = "worker", "Worker"
    SYSTEM = "system", "System"


@dataclass(frozen=True)
class Actor:
    kind: str
    label: str
    user: Any = None
    # The API token a person acted through: (id, prefix), never its secret. Recorded in the
    # data of the events the action writes (record_event).
    api_token: tuple[int, str] | None = None

    @classmethod
    def person(
        cls, user: "User | AnonymousUser", *, api_token: tuple[int, str] | None = None
    ) -> "Actor":
        return cls(kind=ActorKind.PERSON, label=user.get_username(), user=user, api_token=api_token)

    @property
    def event_data(self) -> dict[str, dict[str, int | str]]:
        """What an event records of how the actor acted (the API token's id and prefix)."""
        if self.api_token is None:
            return {}
        token_id, prefix = self.api_token
        return {"api_token": {"id": token_id, "prefix": prefix}}

    @classmethod
    def worker(cls, worker_id: str) -> "Actor":
        return cls(kind=ActorKind.WORKER, label=worker_id)

    @classmethod
    def system(cls, label: str = "system") -> "Actor":
        return cls(kind=ActorKind.SYSTEM, label=label)

    @property
    def is_person(self) -> bool:
        return self.kind == ActorKind.PERSON

    def require(self, perm: str) -> None:
        """Refuse a person without the permission; workers and the system act by design."""

        if self.is_person and not self.user.has_perm(perm):
            raise NotPermitted(f"{self.label} lacks the permission {perm}")
