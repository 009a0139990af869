"""Who acts on a task: a person, a worker, or the system itself. Every event names one."""

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import models

from core.exceptions import NotPermitted

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser, User


class Via(models.TextChoices):
    """Where a person's decision came from (an event's ``via``)."""

    CONSOLE = "console", "Console"
    EMAIL_LINK = "email_link", "Decision link"
    SLACK = "slack", "Slack"


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
    # The door a person decided through (`Via`): recorded in the data of the events the action
    # writes, so a decision from a link or from Slack reads like one from the console.
    via: str = ""

    @classmethod
    def person(
        cls,
        user: "User | AnonymousUser",
        *,
        api_token: tuple[int, str] | None = None,
        via: str = "",
    ) -> "Actor":
        return cls(
            kind=ActorKind.PERSON,
            label=user.get_username(),
            user=user,
            api_token=api_token,
            via=via,
        )

    @property
    def event_data(self) -> dict[str, Any]:
        """What an event records of how the actor acted: the door (`via`) and the API token's id
        and prefix."""
        data: dict[str, Any] = {"via": self.via} if self.via else {}
        if self.api_token is not None:
            token_id, prefix = self.api_token
            data["api_token"] = {"id": token_id, "prefix": prefix}
        return data

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
