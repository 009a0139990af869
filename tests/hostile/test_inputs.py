"""Issue 21 item 10: input files are capped per file and per task, counted while the upload
streams (a 200 MB upload was accepted), through the console's form, the API and the CLI."""

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.files.uploadhandler import FileUploadHandler

from tasks.models import Task
from tasks.workspace import task_dir
from tests.api.conftest import ALL_PERMS, client_for, error_of
from tests.factories import ModelFactory, UserFactory

FILE_CAP = 100_000
TASK_CAP = 250_000
PASSED_ON: list[int] = []  # bytes of each file the storing handlers received


class Recording(FileUploadHandler):
    """Stands between the bounded handler and the ones that store: what reaches storage."""

    def new_file(self, *args, **kwargs):
        super().new_file(*args, **kwargs)
        PASSED_ON.append(0)

    def receive_data_chunk(self, raw_data, start):
        PASSED_ON[-1] += len(raw_data)
        return raw_data

    def file_complete(self, file_size):
        return None


@pytest.fixture
def caps(settings):
    settings.ACTHELM_INPUT_FILE_MAX_BYTES = FILE_CAP
    settings.ACTHELM_TASK_INPUTS_MAX_BYTES = TASK_CAP
    settings.FILE_UPLOAD_HANDLERS = [
        settings.FILE_UPLOAD_HANDLERS[0],
        f"{__name__}.Recording",
        *settings.FILE_UPLOAD_HANDLERS[1:],
    ]
    PASSED_ON.clear()
    return settings


def upload(name: str, size: int):
    return SimpleUploadedFile(name, b"x" * size, content_type="application/octet-stream")


def test_the_bounded_handler_comes_first():
    from django.conf import settings

    assert settings.FILE_UPLOAD_HANDLERS[0] == "tasks.uploads.BoundedUploadHandler"


@pytest.mark.django_db
def test_the_api_refuses_a_file_over_the_cap_while_it_streams(caps):
    api = client_for("founder", ALL_PERMS)
    body = {"title": "T", "instruction": "I", "files": [upload("big.bin", 3 * FILE_CAP)]}
    response = api.post_form("/api/tasks", body)
    assert response.status_code == 400
    error = error_of(response)
    assert error["field"] == "files"
    assert "big.bin" in error["message"] and "ACTHELM_INPUT_FILE_MAX_BYTES" in error["message"]
    assert not Task.objects.exists()
    assert PASSED_ON and max(PASSED_ON) <= FILE_CAP  # never stored beyond the cap


@pytest.mark.django_db
def test_the_api_refuses_files_over_the_task_cap_and_keeps_nothing(caps):
    api = client_for("founder", ALL_PERMS)
    files = [upload(f"part{i}.bin", FILE_CAP - 10) for i in range(3)]  # each fits, not all
    response = api.post_form("/api/tasks", {"title": "T", "instruction": "I", "files": files})
    assert response.status_code == 400
    assert error_of(response)["field"] == "files"
    assert "ACTHELM_TASK_INPUTS_MAX_BYTES" in error_of(response)["message"]
    assert not Task.objects.exists()
    assert sum(PASSED_ON) <= TASK_CAP


@pytest.mark.django_db
def test_files_under_the_caps_are_stored(caps):
    ModelFactory()  # a tested, tool-capable, zero-cost model for a new task
    api = client_for("founder", ALL_PERMS)
    files = [upload("a.bin", FILE_CAP), upload("b.bin", 1000)]
    response = api.post_form("/api/tasks", {"title": "T", "instruction": "I", "files": files})
    assert response.status_code == 201, response.content
    task = Task.objects.get()
    workspace = task_dir(task.pk) / "workspace"
    assert (workspace / "a.bin").stat().st_size == FILE_CAP


@pytest.mark.django_db
def test_the_console_form_refuses_a_file_over_the_cap_on_its_field(caps, client):
    client.force_login(UserFactory(username="boss", perms=ALL_PERMS))
    body = {"title": "T", "instruction": "I", "files": [upload("big.bin", 3 * FILE_CAP)]}
    response = client.post("/tasks/new/", body)
    assert response.status_code == 400
    assert "big.bin" in response.context["form"].errors["files"][0]
    assert not Task.objects.exists()
    assert max(PASSED_ON) <= FILE_CAP


def test_the_cli_refuses_a_file_over_the_cap_and_keeps_nothing(manage, transactional_db, tmp_path):
    ModelFactory()  # a tested, tool-capable, zero-cost model for a new task
    UserFactory(username="ops", is_superuser=True)
    big = tmp_path / "big.bin"
    big.write_bytes(b"x" * (3 * FILE_CAP))
    result = manage(
        "acthelm_task",
        "--json",
        "create",
        "--title",
        "T",
        "--instruction",
        "I",
        "--file",
        str(big),
        env={"ACTHELM_INPUT_FILE_MAX_BYTES": str(FILE_CAP)},
    )
    assert result.returncode == 1
    assert json.loads(result.stdout)["error"] == "invalid_input"
    assert "ACTHELM_INPUT_FILE_MAX_BYTES" in result.stdout
    assert not Task.objects.exists()


# -- hostile bodies: no 500, no HTML, nothing changed ----------------------------------------------

HOSTILE_BODIES = ["ship the release", [1, 2], 3, True, {"reason": "\x00"}, {"x\x00": 1}]


@pytest.mark.django_db
@pytest.mark.parametrize("body", HOSTILE_BODIES, ids=repr)
def test_no_json_endpoint_answers_a_hostile_body_with_500_or_html(body):
    from tasks.states import TaskStatus
    from tests.factories import TaskFactory

    api = client_for("founder", ALL_PERMS)
    ready = TaskFactory(status=TaskStatus.READY)
    review = TaskFactory(status=TaskStatus.REVIEW)
    failed = TaskFactory(status=TaskStatus.FAILED)
    paths = [
        "/api/goals",
        f"/api/tasks/{ready.pk}/cancel",
        f"/api/tasks/{ready.pk}/resume",
        f"/api/tasks/{review.pk}/reopen",
        f"/api/tasks/{failed.pk}/retry",
        f"/api/tasks/{ready.pk}/approvals/1/approve",
    ]
    for path in paths:
        raw = api.client.post(
            path,
            json.dumps(body),
            content_type="application/json",
            headers=api._headers(None),
        )
        assert raw.status_code < 500, (path, raw.content)
        assert raw["Content-Type"].startswith("application/json"), path
        assert set(raw.json()) == {"code", "message", "field"}, (path, raw.json())
    states = {t.pk: t.status for t in Task.objects.all()}
    assert states == {ready.pk: "ready", review.pk: "review", failed.pk: "failed"}
    from tasks.models import Goal

    assert not Goal.objects.exists()


@pytest.mark.django_db
def test_nul_in_every_form_field_of_a_new_task_is_refused_not_500():
    api = client_for("founder", ALL_PERMS)
    fields = ["title", "instruction", "tags", "tools", "ask_tools", "allowed_domains", "kind"]
    for field in fields:
        body = {"title": "T", "instruction": "I", field: "x\x00y"}
        response = api.post_form("/api/tasks", body)
        assert response.status_code == 400, (field, response.content)
        assert error_of(response)["field"] == field
    response = api.get("/api/tasks", {"tag": "\x00"})
    assert response.status_code == 400
    assert not Task.objects.exists()


@pytest.mark.django_db
def test_the_admin_refuses_an_input_file_over_a_cap_on_its_field(caps, client, person):
    from tasks.states import TaskStatus
    from tasks.workspace import add_input_file, list_input_files
    from tests.factories import TaskFactory
    from tests.tasks.test_admin_workspace import upload as admin_upload

    client.force_login(person)
    task = TaskFactory(status=TaskStatus.READY)
    response = admin_upload(client, task, "big.bin", b"x" * (3 * FILE_CAP))
    assert response.status_code == 200
    errors = str(response.context["adminform"].form.errors["input_file"])
    assert "ACTHELM_INPUT_FILE_MAX_BYTES" in errors
    assert list_input_files(task.pk) == []
    # Each under the file cap, but together over the task's cap.
    add_input_file(task.pk, name="a.bin", data=b"x" * FILE_CAP)
    add_input_file(task.pk, name="b.bin", data=b"x" * FILE_CAP)
    response = admin_upload(client, task, "c.bin", b"x" * FILE_CAP)
    assert response.status_code == 200
    errors = str(response.context["adminform"].form.errors["input_file"])
    assert "ACTHELM_TASK_INPUTS_MAX_BYTES" in errors
    assert [f["name"] for f in list_input_files(task.pk)] == ["a.bin", "b.bin"]
