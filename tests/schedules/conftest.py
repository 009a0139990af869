import pytest


@pytest.fixture
def scheduler(db):
    """A person who may add, change and remove schedules."""
    from tests.factories import UserFactory

    return UserFactory(
        username="planner",
        perms=[
            "schedules.view_schedule",
            "schedules.add_schedule",
            "schedules.change_schedule",
            "schedules.delete_schedule",
            "tasks.view_task",
        ],
    )


@pytest.fixture
def planner(scheduler):
    from core.actors import Actor

    return Actor.person(scheduler)


@pytest.fixture
def tested_model(db):
    from tests.factories import ModelFactory

    return ModelFactory()


@pytest.fixture
def make_schedule(planner, tested_model):
    from schedules.services import schedule_create

    def make(now, **fields):
        fields.setdefault("name", f"daily-{len(fields)}-{now:%H%M%S%f}")
        fields.setdefault("cron", "0 8 * * *")
        fields.setdefault("timezone", "UTC")
        fields.setdefault("title", "Summarise yesterday's tickets")
        fields.setdefault("instruction", "Summarise yesterday's support tickets.")
        fields.setdefault("model", tested_model)
        return schedule_create(actor=planner, now=now, **fields)

    return make
