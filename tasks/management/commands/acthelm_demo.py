"""Create the demo account and a little demo data (idempotent): used by `make run`."""

import os
import secrets
import sys

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from agents.models import Connection, Model
from agents.states import ConnectionKind, CostTier, ModelTestStatus
from tasks.actors import Actor
from tasks.models import Goal, Task
from tasks.services import task_create


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
        conn, created = Connection.objects.get_or_create(
            name="demo-cli",
            defaults={
                "kind": ConnectionKind.CLI,
                "command": [sys.executable, "-m", "acthelm_site.demo_model"],
                "cost_tier": CostTier.ZERO_COST,
                "timeout_seconds": 30,
            },
        )
        model, _ = Model.objects.get_or_create(
            connection=conn,
            name="demo",
            defaults={
                "supports_tools": False,
                "test_status": ModelTestStatus.PASSED,
                "test_message": "scripted demo model",
            },
        )
        if Task.objects.exists():
            return
        actor = Actor.person(user)
        goal = Goal.objects.create(title="Ship the quarterly report", created_by=user)
        task_create(
            actor=actor,
            title="Summarise last quarter's support tickets",
            instruction="Summarise the main themes of last quarter's support tickets.",
            goal=goal,
            tools=[],
            connection=conn,
            model=model,
        )
        task_create(
            actor=actor,
            title="Draft the release notes",
            instruction="Draft release notes for version 1.2 from the changelog.",
            goal=goal,
            tools=[],
            connection=conn,
            model=model,
        )
        self.stdout.write("Demo data: one goal, two tasks on the demo-cli connection.")
