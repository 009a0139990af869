"""A person's change reaches the model (agents.actions.task_change.task_change_and_retry): after the
supervisor rejected a run, the person changes the instruction and the checks and retries — the
model continues its conversation and gets one message with the change, or starts over from the
new instruction. Through the API and `acthelm_task edit`, with a real worker process, real
PostgreSQL and the scripted OpenAI-compatible model server, which records what it was sent."""

import json
import threading

import pytest

from agents.actions import task as person_task
from agents.actions import task_change
from agents.actions.task import task_pause
from agents.engine.run.intake import task_create
from agents.engine.run.prompting import CHANGE_HEAD, FEEDBACK_HEAD
from agents.engine.runtime.worker import Worker
from agents.models import AgentRun, Conversation, ToolCall, Turn
from agents.selectors import task_run_facts
from agents.states import Verdict
from core.actors import Actor
from core.exceptions import InvalidInput
from tasks.models import Task, TaskEvent
from tasks.states import EventKind, TaskStatus
from tests.agents.conftest import run_burst
from tests.agents.rejections import rejected_task
from tests.api.conftest import client_for
from tests.factories import UserFactory
from tests.fakes.model_server import reply_text, reply_tool_calls

INSTRUCTION = "Report the quarter's revenue and its churn."
CHANGED = "Report the quarter's revenue only, in millions."
FIRST_ANSWER = "Revenue was 10 (in millions)."
SECOND_ANSWER = "Revenue: 10 million."
FOUR = {"kind": "answer_contains", "value": "four"}
# One attempt: the rejection fails the task at once, as after the last of its attempts.
ONE_ATTEMPT = {"ACTHELM_MAX_ATTEMPTS": "1"}


def messages_of(request) -> list[dict]:
    return request.json["messages"]


def raw_messages(request) -> str:
    """The request's messages exactly as the provider wrote them, without the closing bracket."""
    body = request.body.decode()
    start = body.index("[", body.index('"messages"'))
    _, end = json.JSONDecoder().raw_decode(body, start)
    return body[start : end - 1]


def rejected(model_server, http_model, spawn_worker):
    """A task run by a real worker until the supervisor rejected it (answer_contains=churn) and
    it failed: the scripted server holds the second answer for the retry."""
    server = model_server([reply_text(FIRST_ANSWER), reply_text(SECOND_ANSWER)])
    model = http_model(server)
    task = task_create(
        actor=Actor.system("test"),
        title="Quarter",
        instruction=INSTRUCTION,
        tools=[],
        model=model,
        acceptance_checks=["answer_contains=churn"],
    )
    assert spawn_worker("--burst", env=ONE_ATTEMPT).wait() == 0
    task.refresh_from_db()
    assert task.status == TaskStatus.FAILED, task.failure_message
    assert task.failure_code == "supervisor_rejected" and "answer_contains=churn" in (
        task.failure_message
    )
    assert len(server.completion_requests) == 1
    return task, server


def run_again(spawn_worker, task):
    assert spawn_worker("--burst", env=ONE_ATTEMPT).wait() == 0
    task.refresh_from_db()
    return task


@pytest.mark.django_db(transaction=True)
def test_through_the_api_the_model_continues_with_one_message_of_the_change(
    model_server, http_model, spawn_worker
):
    task, server = rejected(model_server, http_model, spawn_worker)
    first = server.completion_requests[0]
    api = client_for("founder", ["tasks.view_task", "tasks.operate_task"])
    # The new check passes the old answer: judging it again without asking would approve it.
    response = api.patch(
        f"/api/tasks/{task.pk}",
        {"instruction": CHANGED, "acceptance_checks": ["answer_contains=revenue"], "retry": True},
    )
    assert response.status_code == 200, response.content
    task = run_again(spawn_worker, task)

    # The model was asked again, and the answer in review is the new one.
    assert len(server.completion_requests) == 2
    assert task.status == TaskStatus.REVIEW
    newest = AgentRun.objects.filter(task=task).order_by("-number").first()
    assert newest.answer == SECOND_ANSWER and newest.verdict == Verdict.APPROVED
    # The stored prefix as it was sent (so the provider's prompt cache holds), the answer it
    # gave, and exactly one message more: the change.
    second = server.completion_requests[1]
    before, after = messages_of(first), messages_of(second)
    assert after[: len(before)] == before
    assert raw_messages(second).startswith(raw_messages(first))
    assert after[len(before)] == {"role": "assistant", "content": FIRST_ANSWER}
    assert len(after) == len(before) + 2
    change = after[-1]
    assert change["role"] == "user" and change["content"].startswith(CHANGE_HEAD)
    assert CHANGED in change["content"] and "answer_contains=revenue" in change["content"]
    # The feedback for the check that was taken away is dropped.
    assert "churn" not in change["content"]
    assert FEEDBACK_HEAD not in change["content"]
    # The retried run is the next attempt, in the API's task document as on the page.
    runs = api.get(f"/api/tasks/{task.pk}").json()["runs"]
    assert [(r["number"], r["attempt"]) for r in runs] == [(1, 1), (2, 2)]
    retried = TaskEvent.objects.get(task=task, kind=EventKind.RETRIED)
    assert retried.data["change_sent"] == ["acceptance_checks", "instruction"]


@pytest.mark.django_db(transaction=True)
def test_from_the_cli_the_model_starts_over_from_the_new_instruction(
    model_server, http_model, spawn_worker, manage
):
    task, server = rejected(model_server, http_model, spawn_worker)
    old_prompt = Conversation.objects.get(task=task).system_prompt
    old_turns = list(Turn.objects.filter(task=task).values_list("index", "role", "content"))
    UserFactory(username="rev", perms=["tasks.view_task", "tasks.operate_task"])
    result = manage(
        "acthelm_task",
        "--user",
        "rev",
        "--json",
        "edit",
        str(task.pk),
        "--instruction",
        CHANGED,
        "--expect",
        "answer_contains=revenue",
        "--retry",
        "--start-over",
        check=True,
    )
    assert json.loads(result.stdout)["status"] == TaskStatus.READY
    task = run_again(spawn_worker, task)

    assert len(server.completion_requests) == 2
    assert task.status == TaskStatus.REVIEW
    # A fresh conversation: a newly built system prompt and the new instruction, nothing else.
    after = messages_of(server.completion_requests[1])
    assert [m["role"] for m in after] == ["system", "user"]
    assert after[1]["content"] == f"## Task\n{CHANGED}"
    assert FIRST_ANSWER not in json.dumps(after) and "churn" not in json.dumps(after)
    # The earlier conversation stays on record: its turns, its run, its prompt.
    conversation = Conversation.objects.get(task=task)
    assert conversation.first_turn == len(old_turns)
    assert conversation.system_prompt == after[0]["content"]
    assert [(e["first_turn"], e["until_turn"]) for e in conversation.earlier] == [
        (0, len(old_turns))
    ]
    assert conversation.earlier[0]["system_prompt"] == old_prompt
    turns = list(Turn.objects.filter(task=task).order_by("index"))
    assert [(t.index, t.role, t.content) for t in turns[: len(old_turns)]] == old_turns
    assert [t.content for t in turns[len(old_turns) :]] == [f"## Task\n{CHANGED}", SECOND_ANSWER]
    assert [f.attempt for f in task_run_facts(task.pk)] == [1, 2]
    retried = TaskEvent.objects.get(task=task, kind=EventKind.RETRIED)
    assert retried.data["start_over"] is True and retried.actor_label == "rev"


# --- the service's choices, without a worker -----------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("failed", [False, True], ids=["retry-scheduled", "failed"])
def test_continue_keeps_only_the_feedback_that_still_applies(actor, failed):
    """named_output=summary.md (a default check of the old instruction) and answer_contains=four
    (a check taken away) failed; the change keeps neither, and names the checks in force."""
    task = rejected_task(failed=failed, acceptance_checks=[FOUR])
    Conversation.objects.create(task=task, system_prompt="s", system_prompt_sha256="x")
    task_change.task_change_and_retry(
        actor=actor,
        task_id=task.pk,
        changes={
            "instruction": "Write the bullets to report.md",
            "acceptance_checks": ["artifact=report.md"],
        },
    )
    task.refresh_from_db()
    assert task.status == TaskStatus.READY and task.not_before is None
    assert task.feedback.startswith(CHANGE_HEAD)
    assert "Write the bullets to report.md" in task.feedback
    assert "- artifact=report.md" in task.feedback
    assert "four" not in task.feedback and "summary.md" not in task.feedback


@pytest.mark.django_db
def test_continue_keeps_the_failure_of_a_check_still_in_force(actor):
    task = rejected_task(failed=True, acceptance_checks=[FOUR])
    Conversation.objects.create(task=task, system_prompt="s", system_prompt_sha256="x")
    task_change.task_change_and_retry(
        actor=actor,
        task_id=task.pk,
        changes={"acceptance_checks": ["answer_contains=four", "artifact=report.md"]},
    )
    feedback = Task.objects.get(pk=task.pk).feedback
    assert "task check answer_contains=four failed: the answer does not contain 'four'" in feedback
    # The instruction did not change: its default check's failure still applies.
    assert "default check named_output=summary.md failed" in feedback


@pytest.mark.django_db
def test_a_plain_retry_of_a_rejected_run_gives_the_rejection_as_feedback(actor):
    """So the next run asks the model again rather than judging the stored answer once more."""
    task = rejected_task(failed=True)
    assert task.feedback == ""
    person_task.task_retry(actor=actor, task_id=task.pk)
    task.refresh_from_db()
    assert task.status == TaskStatus.READY
    assert "answer_contains=four failed" in task.feedback


@pytest.mark.django_db
def test_starting_over_needs_the_retry(actor):
    task = rejected_task(failed=True)
    with pytest.raises(InvalidInput, match="starting over"):
        task_change.task_change_and_retry(
            actor=actor, task_id=task.pk, changes={"instruction": "x"}, retry=False, start_over=True
        )
    assert Task.objects.get(pk=task.pk).instruction != "x"


@pytest.mark.django_db(transaction=True)
def test_a_change_to_a_paused_task_follows_the_results_of_its_open_calls(
    model_server, http_model, loop_task, fast_worker_settings, person
):
    """Paused with a call of its last turn still open, changed (Save, no retry), resumed: the
    open call runs first and the change follows its result, so the model is never sent a tool
    call without its result, and the call is not left unrun."""
    plan = ("update_plan", {"steps": [{"step": "List the files"}, {"step": "Report"}]})
    server = model_server(
        [
            reply_tool_calls([plan]),
            reply_tool_calls([("list_files", {})], delay=1.0),
            reply_text("The report: nothing new."),
        ]
    )
    task = loop_task(http_model(server))
    worker = Worker(worker_id="w", burst=True)
    thread = threading.Thread(target=worker.run)
    thread.start()
    assert server.wait_for_requests(2, 10)
    task_pause(actor=Actor.person(person), task_id=task.pk)
    thread.join(15)
    assert Task.objects.get(pk=task.pk).status == TaskStatus.PAUSED
    call = ToolCall.objects.get(task=task, tool="list_files")
    assert call.run_count == 0  # stopped at the safe point before its round

    task_change.task_change_and_retry(
        actor=Actor.person(person),
        task_id=task.pk,
        changes={"instruction": "Write a short report on the notes, in French."},
        retry=False,
    )
    person_task.task_resume(actor=Actor.person(person), task_id=task.pk)
    run_burst("w2")

    assert Task.objects.get(pk=task.pk).status == TaskStatus.REVIEW
    messages = server.completion_requests[2].json["messages"]
    roles = ["system", "user", "assistant", "tool", "assistant", "tool", "user"]
    assert [m["role"] for m in messages] == roles
    assert messages[5]["tool_call_id"] == call.call_id and messages[5]["content"]
    assert messages[6]["content"].startswith(CHANGE_HEAD) and "in French" in messages[6]["content"]
    call.refresh_from_db()
    assert call.run_count == 1
