"""Create the demo account and a little demo data (idempotent): used by `make run`."""

import os
import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from agents.models import Connection, Model
from agents.states import ConnectionKind, CostTier, ModelTestStatus
from agents.task_services import task_create
from tasks.actors import Actor
from tasks.models import Goal, Task
from tasks.workspace import add_input_file


class Command(BaseCommand):
    help = "Create a demo superuser (printing its name and password) and demo tasks."

    def handle(self, *args, **opts):
        User = get_user_model()
        username = os.environ.get("ACTHELM_DEMO_USER", "founder")
        password = os.environ.get("ACTHELM_DEMO_PASSWORD")
        with transaction.atomic():
            user = User.objects.filter(username=username).first()
            if user is None:
                password = password or secrets.token_urlsafe(9)
                user = User.objects.create_superuser(username, f"{username}@example.com", password)
                self.stdout.write(f"Demo account: {username} / {password}")
            elif password:
                user.set_password(password)
                user.save(update_fields=["password"])
                self.stdout.write(f"Demo account: {username} / {password}")
            else:
                self.stdout.write(
                    f"Demo account: {username} (password unchanged; set ACTHELM_DEMO_PASSWORD "
                    "to reset it)"
                )
            self._demo_data(user)

    def _demo_data(self, user):
        port = os.environ.get("ACTHELM_DEMO_MODEL_PORT", "8765")
        conn, _ = Connection.objects.update_or_create(
            name="demo",
            defaults={
                "kind": ConnectionKind.OPENAI_COMPATIBLE,
                "base_url": f"http://127.0.0.1:{port}/v1",
                "cost_tier": CostTier.ZERO_COST,
                "timeout_seconds": 30,
            },
        )
        model, _ = Model.objects.get_or_create(
            connection=conn,
            name="demo",
            defaults={
                "supports_tools": True,
                "context_window": 32768,
                "test_status": ModelTestStatus.PASSED,
                "test_message": "Acthelm's scripted demo model (python -m acthelm_site.demo_model)",
            },
        )
        if Task.objects.exists() or Goal.objects.exists():
            return
        actor = Actor.person(user)
        # A goal with no work yet: the reconciler gives it a planning task, whose run proposes
        # two linked follow-up tasks; the worker runs those too, and they wait in review.
        Goal.objects.create(
            title="Ship the quarterly report",
            description="Get the Q3 report written and reviewed.",
            created_by=user,
        )
        task = task_create(
            actor=actor,
            title="Summarise last quarter's support tickets",
            instruction="Summarise the main themes of the support tickets in tickets.csv.",
            model=model,
        )
        add_input_file(
            task.pk,
            name="tickets.csv",
            data="id,topic,minutes\n1,login,12\n2,billing,30\n3,login,8\n4,export,25\n",
        )
        self.stdout.write(
            "Demo data: a goal for the reconciler to plan, and a task with an input file, on "
            "the scripted demo model."
        )
