# ruff: noqa: F811 - the worker fixtures of tests/agents/conftest.py are imported below
"""The outbox is written with the event: one row per target that wants it, for the four waiting
states and a cooldown reached through the real worker paths; nothing when the transaction rolls
back; and the message says what waits, for whom, with the console link and no credential."""

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from agents.engine.runtime.recovery import recover_stale
from agents.engine.runtime.worker import Worker
from agents.models import AgentRun, Connection
from agents.states import RunStatus
from approvals.models import Approval, ReviewDecision
from core.actors import Actor
from tasks.models import Task, TaskEvent
from tasks.notify.links import LinkKind, LinkTarget, read_link
from tasks.notify.models import Notification
from tasks.notify.outbox import argument_summary, redact
from tasks.notify.states import NotifyEvent, TargetKind
from tasks.notify.targets import target_add
from tasks.states import EventKind, TaskStatus
from tasks.transitions import lock_task, record_event, set_status
from tests.agents.conftest import (  # noqa: F401 - fixtures
    cli_model,
    cli_task,
    fast_worker_settings,
    wait_for,
)
from tests.agents.scripted import fast_settings, status_of, tool_task
from tests.factories import ApprovalFactory, TaskFactory, ToolCallFactory, UserFactory
from tests.fakes.http_target import HttpTarget
from tests.fakes.model_server import ScriptedModelServer, reply_text, reply_tool_calls

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def everyone(settings):
    settings.ACTHELM_BASE_URL = "https://acthelm.example.org"
    return target_add(name="founder", kind=TargetKind.EMAIL, address="founder@example.org")


def rows_of(task) -> list[tuple[str, str]]:
    return list(
        Notification.objects.filter(task=task)
        .order_by("id")
        .values_list("event_kind", "target_name")
    )


def opened_by(url: str) -> LinkTarget:
    """What a notification's decision link opens (…/decide/<kind>/<token>/)."""
    kind, token = url.rstrip("/").split("/")[-2:]
    return read_link(kind, token)


def work(worker_id="w") -> None:
    Worker(worker_id=worker_id, burst=True).run()


# --- Written with the event, or not at all ----------------------------------------------------


def test_nothing_is_written_when_the_transition_rolls_back(everyone):
    task = TaskFactory(status=TaskStatus.IN_PROGRESS)
    with pytest.raises(RuntimeError), transaction.atomic():
        locked = lock_task(task.pk)
        set_status(locked, TaskStatus.REVIEW, actor=Actor.worker("w"), kind=EventKind.SUBMITTED)
        assert Notification.objects.filter(task=task).count() == 1  # written in the transaction
        raise RuntimeError("the worker's transaction fails after the event")
    assert Notification.objects.count() == 0 and status_of(task) == TaskStatus.IN_PROGRESS
    with transaction.atomic():
        locked = lock_task(task.pk)
        set_status(locked, TaskStatus.REVIEW, actor=Actor.worker("w"), kind=EventKind.SUBMITTED)
    event = TaskEvent.objects.get(task=task, kind=EventKind.SUBMITTED)
    [row] = Notification.objects.all()
    assert (row.event_id, row.event_kind, row.status) == (event.pk, "review", "pending")


def test_each_target_gets_only_the_events_it_chose_and_a_disabled_one_nothing(settings):
    target_add(name="all", kind=TargetKind.EMAIL, address="a@example.org")
    target_add(
        name="reviews",
        kind=TargetKind.WEBHOOK,
        address="https://hooks.example.org/x",
        events=[NotifyEvent.REVIEW],
    )
    off = target_add(name="off", kind=TargetKind.EMAIL, address="off@example.org")
    off.enabled = False
    off.save()
    for to, kind in ((TaskStatus.FAILED, EventKind.FAILED), (TaskStatus.REVIEW, "submitted")):
        task = TaskFactory(status=TaskStatus.IN_PROGRESS)
        with transaction.atomic():
            set_status(lock_task(task.pk), to, actor=Actor.worker("w"), kind=kind)
        expected = [(str(to), "all")] + ([("review", "reviews")] if to == "review" else [])
        assert sorted(rows_of(task)) == sorted(expected)


def test_ordinary_events_and_a_cooldown_already_running_write_nothing(everyone):
    task = TaskFactory(status=TaskStatus.IN_PROGRESS)
    with transaction.atomic():
        locked = lock_task(task.pk)
        for kind in (EventKind.MODEL_TURN, EventKind.TOOL_RESULT, EventKind.APPROVAL_REQUESTED):
            record_event(locked, actor=Actor.worker("w"), kind=kind)
        record_event(
            locked,
            actor=Actor.worker("w"),
            kind=EventKind.PROVIDER_COOLDOWN,
            data={"connection": "c", "code": "provider_cooling_down", "until": None},
        )
    assert Notification.objects.count() == 0


class _Statements(list[str]):
    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        self.append(sql)
        return execute(sql, params, many, context)


def test_the_hot_path_pays_nothing_and_a_notified_event_a_fixed_few_queries(everyone):
    target_add(name="chat", kind=TargetKind.WEBHOOK, address="https://hooks.example.org/x")
    task = TaskFactory(status=TaskStatus.IN_PROGRESS, created_by=UserFactory())
    with transaction.atomic():
        locked = lock_task(task.pk)
        # Every statement, the ones built once without the ORM (core.fastsql) included.
        with connection.execute_wrapper(plain := _Statements()):
            record_event(locked, actor=Actor.worker("w"), kind=EventKind.MODEL_TURN)
        with connection.execute_wrapper(notified := _Statements()):
            record_event(
                locked,
                actor=Actor.worker("w"),
                kind=EventKind.SUBMITTED,
                from_status=TaskStatus.IN_PROGRESS,
                to_status=TaskStatus.REVIEW,
            )
    assert len(plain) == 1  # the event's INSERT only: no lookup for ordinary events
    # The event, the targets wanting it, the task's creator (for the message), one bulk INSERT.
    assert len(notified) == 4
    assert Notification.objects.filter(task=task).count() == 2


# --- The message --------------------------------------------------------------------------------


def test_an_approval_message_names_tool_target_arguments_and_links_the_inbox_entry(everyone):
    alice = UserFactory(username="alice")
    task = TaskFactory(status=TaskStatus.IN_PROGRESS, title="Check the site", created_by=alice)
    call = ToolCallFactory(
        task=task,
        tool="fetch_url",
        arguments={"url": "https://example.com/a?token=abc123&q=1", "api_key": "sk-live-999"},
    )
    approval = ApprovalFactory(
        tool_call=call, target="https://user:pw@example.com/a?token=abc123&q=1"
    )
    with transaction.atomic():
        set_status(
            lock_task(task.pk),
            TaskStatus.AWAITING_APPROVAL,
            actor=Actor.worker("w"),
            kind=EventKind.APPROVAL_REQUESTED,
        )
    row = Notification.objects.get()
    link = row.url
    assert link.startswith("https://acthelm.example.org/decide/approval/")
    assert opened_by(link) == LinkTarget(LinkKind.APPROVAL, approval.pk, approval.arguments_hash)
    assert row.text.endswith(f"Approve or deny: {link}")
    assert row.subject == f"Approval needed: task #{task.pk} “Check the site”"
    assert "waits for a person who may decide operations (created by alice)" in row.text
    assert "fetch_url https://***@example.com/a?token=***&q=1" in row.text
    for secret in ("abc123", "sk-live-999", "user:pw"):
        assert secret not in row.text and secret not in str(row.payload)
    [entry] = row.payload["approvals"]
    assert entry["tool"] == "fetch_url" and entry["arguments_hash"] == approval.arguments_hash
    assert entry["arguments"] == 'url="https://example.com/a?token=***&q=1", api_key=***'


def test_argument_summaries_stay_short_and_one_line():
    summary = argument_summary({"content": "line\n" * 5000, "name": "report.md"})
    assert len(summary) <= 300 and "\n" not in summary and 'name="report.md"' in summary
    redacted = redact("password=hunter2 Authorization: Bearer tok-42 https://u:p@h/x")
    assert not {"hunter2", "tok-42", "u:p"} & set(redacted.replace("=", " ").split())
    assert "hunter2" not in redacted and "tok-42" not in redacted and "u:p@" not in redacted


# --- Through the real worker paths --------------------------------------------------------------


def test_review_and_failed_through_the_worker(cli_model, cli_task, fast_worker_settings, everyone):
    done = cli_task(cli_model("--mode", "echo"))
    untested = cli_model("--mode", "echo", name="untested")
    untested.test_status = "failed"
    untested.save()
    broken = cli_task(untested)
    work()
    assert status_of(done) == TaskStatus.REVIEW and status_of(broken) == TaskStatus.FAILED
    assert rows_of(done) == [("review", "founder")]
    assert rows_of(broken) == [("failed", "founder")]
    row = Notification.objects.get(task=broken)
    assert row.payload["failure"]["code"] == "model_untested"
    assert row.url == f"https://acthelm.example.org/tasks/{broken.pk}/"


def test_a_cooldown_started_by_a_rate_limit_through_the_worker(
    cli_model, cli_task, fast_worker_settings, everyone
):
    limited = cli_model(
        "--mode", "fail", "--exit-code", "1", "--stderr", "Error: 429 Too Many Requests"
    )
    task = cli_task(limited)
    work()
    assert status_of(task) == TaskStatus.READY  # waits for the cooldown to end
    [row] = Notification.objects.filter(task=task)
    assert row.event_kind == "cooldown"
    assert row.payload["connection"]["name"] == limited.connection.name
    assert row.payload["connection"]["code"] == "provider_rate_limited"
    assert row.url == "https://acthelm.example.org/connections/"
    # The next task meets a connection that is already cooling down: no second message.
    Connection.objects.filter(pk=limited.connection_id).update(
        cooldown_until=timezone.now() + timedelta(minutes=30)
    )
    Task.objects.filter(pk=task.pk).update(not_before=None)
    work()
    assert Notification.objects.filter(event_kind="cooldown").count() == 1


def test_awaiting_approval_through_the_worker(settings, everyone):
    fast_settings(settings)
    script = [
        reply_tool_calls([("write_artifact", {"name": "r.md", "content": "# Hi"}, "w1")]),
        reply_text("Written."),
    ]
    with ScriptedModelServer(script) as server:
        task = tool_task(server, ["write_artifact"], tool_policies={"write_artifact": "ask"})
        work()
    assert status_of(task) == TaskStatus.AWAITING_APPROVAL
    [row] = Notification.objects.filter(task=task)
    approval = Approval.objects.get(task=task)
    assert row.event_kind == "awaiting_approval"
    assert opened_by(row.url) == LinkTarget(LinkKind.APPROVAL, approval.pk, approval.arguments_hash)
    [entry] = row.payload["approvals"]
    assert entry["url"].endswith(f"/approvals/#approval-{approval.pk}")
    assert entry["link"] == row.url and entry["arguments_hash"] == approval.arguments_hash
    assert "write_artifact r.md" in row.text and 'content="# Hi"' in row.text


def test_needs_review_through_the_worker_after_a_lost_fetch(settings, everyone):
    fast_settings(settings)
    with HttpTarget() as target:
        url = f"{target.url}/slow?chunks=300&delay=0.1"
        script = [reply_tool_calls([("fetch_url", {"url": url}, "f1")]), reply_text("Done.")]
        with ScriptedModelServer(script) as server:
            task = tool_task(server, ["fetch_url"], allowed_domains=["127.0.0.1"])
            thread = threading.Thread(target=work)
            thread.start()
            wait_for(lambda: target.counts["/slow"] == 1, message="the fetch")
            run = AgentRun.objects.get(task=task, status=RunStatus.STARTED)
            AgentRun.objects.filter(pk=run.pk).update(
                started_at=timezone.now() - timedelta(hours=2)
            )
            recover_stale()  # the run is lost mid-fetch; the same worker claims the task again
            thread.join(30)
    assert status_of(task) == TaskStatus.NEEDS_REVIEW
    [row] = Notification.objects.filter(task=task)
    decision = ReviewDecision.objects.get(task=task)
    assert row.event_kind == "needs_review"
    call_hash = decision.tool_call.arguments_hash
    assert opened_by(row.url) == LinkTarget(LinkKind.REVIEW, decision.pk, call_hash)
    assert row.payload["operations"][0]["arguments_hash"] == call_hash
    assert "fetch_url" in row.text and "Run it again or skip it" in row.text


def test_no_target_no_row_and_the_task_path_is_unchanged(cli_model, cli_task, fast_worker_settings):
    task = cli_task(cli_model("--mode", "echo"))
    work()
    assert status_of(task) == TaskStatus.REVIEW and Notification.objects.count() == 0
