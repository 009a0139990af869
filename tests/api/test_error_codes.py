"""Every code the API answers with is a member of the registry (`core.exceptions.ErrorCode`) and
comes with the member's status: the endpoints' declared error responses, the codes the API's
handlers and middleware name, and the table of docs/api.md. (Each answer an API test reads through
`error_of` is checked the same way, `tests.api.conftest.registered`.)"""

import ast
import re
from pathlib import Path

import pytest

from acthelm_site.api import middleware
from acthelm_site.api.endpoints import NINJA_CODES
from acthelm_site.api.endpoints import api as ninja_api
from core.exceptions import ErrorCode
from tests.api.conftest import error_of, registered

ROOT = Path(__file__).resolve().parents[2]
# A row of docs/api.md's error table: | status | when | codes |
ROW = re.compile(r"^\| (\d{3}) \| .* \| ([^|]+) \|$")


def _documented() -> list[tuple[str, int]]:
    """(code, status) of each code the table lists, as often as it lists it."""
    text = (ROOT / "docs/api.md").read_text()
    table = text.split("## Errors", 1)[1].split("\n## ", 1)[0]
    out = []
    for line in table.splitlines():
        match = ROW.match(line)
        if match:
            out += [(code, int(match.group(1))) for code in re.findall(r"`(\w+)`", match.group(2))]
    return out


def _named_by_the_api() -> set[ErrorCode]:
    """The members the API's own modules name (its handlers, its middleware, its raises)."""
    named = set()
    for path in (ROOT / "acthelm_site/api").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "ErrorCode"
            ):
                named.add(ErrorCode[node.attr])
    return named


def test_each_error_status_an_endpoint_declares_has_its_codes():
    schema = ninja_api.get_openapi_schema()
    declared = set()
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                if int(status) < 400:
                    continue
                declared.add(int(status))
                ref = response["content"]["application/json"]["schema"]["$ref"]
                assert ref.endswith("/ErrorOut"), (method, path, status)
    by_status = {code.http_status for code in ErrorCode}
    assert declared == {400, 401, 403, 404, 409, 422, 503}
    assert declared <= by_status


def test_every_documented_code_is_a_member_with_its_status():
    documented = _documented()
    assert len(documented) >= 20, documented  # the table was read
    known = {str(code): code.http_status for code in ErrorCode}
    wrong = [
        (code, status, known.get(code)) for code, status in documented if known.get(code) != status
    ]
    assert not wrong, f"docs/api.md: (code, the doc's status, the registry's): {wrong}"


# Named in the API's package but never answered by it: `error` keeps a status ninja chose,
# `throttled` answers ninja's throttling (none is set); a token is made and found by
# `acthelm_token` and the admin only.
NOT_ANSWERED = {
    ErrorCode.ERROR,
    ErrorCode.THROTTLED,
    ErrorCode.TOKEN_HOLDER_NOT_ELIGIBLE,
    ErrorCode.TOKEN_NOT_FOUND,
}


def test_every_code_the_api_names_is_documented():
    documented = {code for code, _status in _documented()}
    missing = {str(code) for code in _named_by_the_api() - NOT_ANSWERED} - documented
    assert not missing, f"add to docs/api.md's error table: {sorted(missing)}"


def test_the_handlers_answer_each_code_with_its_status():
    for status, code in {**NINJA_CODES, **middleware.CODES}.items():
        assert code.http_status == status, (status, code)
    assert set(middleware.CODES.values()) >= {
        ErrorCode.METHOD_NOT_ALLOWED,
        ErrorCode.BODY_TOO_LARGE,
        ErrorCode.SERVER_ERROR,
    }


@pytest.mark.parametrize(
    ("code", "status"),
    [("token_missing", 400), ("invented_code", 400), ("path_outside_workspace", 409)],
)
def test_an_unregistered_or_misplaced_code_is_caught(code, status):
    with pytest.raises(AssertionError):
        registered(code, status)


def test_a_code_passed_on_answers_400():
    registered("path_outside_workspace", 400)
    registered("credential_not_allowed", 400)


@pytest.mark.parametrize(
    ("request_of", "status", "code"),
    [
        (lambda c: c.get("/api/tasks", headers={"Authorization": ""}), 401, "token_missing"),
        (
            lambda c: c.get("/api/tasks", headers={"Authorization": "Bearer x"}),
            401,
            "token_invalid",
        ),
        (lambda c: c.get("/api/tasks/999999"), 404, "task_not_found"),
        (lambda c: c.post("/api/connections/999999/test"), 404, "connection_not_found"),
        (lambda c: c.get("/api/no-such-path"), 404, "not_found"),
        (lambda c: c.delete("/api/tasks"), 405, "method_not_allowed"),
        (lambda c: c.post_form("/api/tasks", {"title": "t"}), 400, "invalid_input"),
        (
            lambda c: c.post_form("/api/tasks", {"title": "t", "instruction": "i", "colour": "r"}),
            422,
            "unknown_field",
        ),
    ],
)
def test_the_api_answers_with_the_registrys_status(api, request_of, status, code):
    response = request_of(api)
    assert response.status_code == status, response.content
    assert error_of(response)["code"] == code
