"""Create the demo account and a little demo data (idempotent): used by `make run`."""

import os
import secrets
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction

from agents.engine.run.intake import task_create
from agents.models import Connection, Model
from agents.states import ConnectionKind, CostTier, ModelTestStatus
from core.actors import Actor
from core.commands import CHECKS
from tasks.models import Goal, Task
from tasks.workspace import add_input_file


def _password_file() -> Path:
    """The generated demo password, kept beside the media folder (var/, ignored by git) so that
    every `make run` can print it beside the console's address (one set with
    ACTHELM_DEMO_PASSWORD is the person's own and is not written down)."""
    return Path(settings.ACTHELM_MEDIA_ROOT).parent / "demo-password"


def _remember(password: str) -> None:
    path = _password_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.write_text(password)


def _remembered(user: User) -> str | None:
    try:
        password = _password_file().read_text().strip()
    except OSError:
        return None
    return password if password and user.check_password(password) else None


def _answers(url: str) -> bool:
    """Whether something listens where the URL points (a demo model of another `make run`)."""
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname, parts.port or 80), timeout=0.5):
            return True
    except (OSError, ValueError):
        return False


class Command(BaseCommand):
    requires_system_checks = CHECKS  # all but the URLconf's: core/commands.py
    help = "Create a demo superuser (printing its name and password) and demo tasks."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--console-url", help="print this address with the demo account (make run does)"
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        User = get_user_model()
        username = os.environ.get("ACTHELM_DEMO_USER", "founder")
        password = os.environ.get("ACTHELM_DEMO_PASSWORD")
        conn = self._demo_connection()  # before the transaction: it may try a socket
        with transaction.atomic():
            user = User.objects.filter(username=username).first()
            if user is None:
                if not password:  # generated: remembered, to be printed on every run
                    password = secrets.token_urlsafe(9)
                    _remember(password)
                user = User.objects.create_superuser(username, f"{username}@example.com", password)
            elif password:
                user.set_password(password)
                user.save(update_fields=["password"])
            else:
                password = _remembered(user)
            if password:
                account = f"{username} / {password}"
            else:
                account = f"{username} (password unchanged; ACTHELM_DEMO_PASSWORD=… resets it)"
            self.stdout.write(f"Demo account: {account}")
            self._demo_data(user, conn)
        if opts.get("console_url"):
            url = opts["console_url"].rstrip("/")
            self.stdout.write(f"Console: {url}/  sign in as {account}  (admin: {url}/admin/)")

    def _demo_connection(self) -> Connection:
        """The demo connection points at this run's demo model, unless another `make run`'s
        demo model answers where it points now: that run keeps its connection."""
        port = os.environ.get("ACTHELM_DEMO_MODEL_PORT", "8765")
        url = f"http://127.0.0.1:{port}/v1"
        conn = Connection.objects.filter(name="demo").first()
        if conn is None:
            return Connection.objects.create(
                name="demo",
                kind=ConnectionKind.OPENAI_COMPATIBLE,
                base_url=url,
                cost_tier=CostTier.ZERO_COST,
                timeout_seconds=30,
            )
        if conn.base_url != url:
            if _answers(conn.base_url):
                self.stdout.write(
                    f"Demo connection: stays on {conn.base_url} (a demo model answers there, "
                    f"perhaps another make run's); this run's demo model on {url} is unused."
                )
            else:
                Connection.objects.filter(pk=conn.pk).update(base_url=url)
                self.stdout.write(f"Demo connection: now on {url}")
        return conn

    def _demo_data(self, user: User, conn: Connection) -> None:
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
