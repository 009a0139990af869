"""Every error's code is a member of one registry (`ErrorCode`), which carries the HTTP status the
console and the API answer with; no raise names a code by a literal string."""

import ast
import importlib
from pathlib import Path

import pytest

from acthelm_site.api.tokens import TokenNotFound, TokenRefused
from core import exceptions as e
from core.exceptions import ActhelmError, ErrorCode
from tasks.notify.channels import DeliveryCode, DeliveryFailed
from tasks.notify.links import LinkExpired, LinkRefused
from tasks.notify.targets import TargetNotFound

ROOT = Path(__file__).resolve().parents[2]
APPS = ("acthelm_site", "console", "schedules", "agents", "approvals", "tasks", "memory", "core")


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (e.InvalidInput, 400),
        (e.DependencyCycle, 400),
        (LinkRefused, 400),
        (TokenRefused, 401),
        (e.NotPermitted, 403),
        (e.NotFound, 404),
        (e.TaskNotFound, 404),
        (e.GoalNotFound, 404),
        (TokenNotFound, 404),
        (TargetNotFound, 404),
        (LinkExpired, 410),
        (e.TransitionNotAllowed, 409),
        (e.LimitNotRaised, 409),
        (e.StaleDecision, 409),
        (e.ModelCheckFailed, 409),
        (e.AttemptLost, 409),
        (e.ActhelmError, 409),
    ],
)
def test_each_error_says_its_status(error, status):
    refused = error("refused")
    assert refused.http_status == status
    assert refused.code == refused.error and refused.error.http_status == status


def test_a_code_named_at_the_raise_brings_its_status():
    refused = e.NotFound("no such connection", code=ErrorCode.CONNECTION_NOT_FOUND)
    assert (refused.code, refused.http_status) == ("connection_not_found", 404)
    refused = TokenRefused("not staff", code=ErrorCode.TOKEN_HOLDER_NOT_ALLOWED)
    assert (refused.code, refused.http_status) == ("token_holder_not_allowed", 401)


def test_a_code_of_another_registry_is_passed_on_with_the_errors_own_status():
    refused = e.InvalidInput.passing("outside", code="path_outside_workspace", field="arguments")
    assert (refused.code, refused.http_status, refused.field) == (
        "path_outside_workspace",
        400,
        "arguments",
    )
    assert e.InvalidInput.passing("plain", code=None).code == ErrorCode.INVALID_INPUT
    failed = DeliveryFailed("no answer", code=DeliveryCode.TIMEOUT)
    assert (failed.code, failed.http_status) == ("timeout", 409)


def test_each_code_is_one_member_with_an_error_status():
    """With values and statuses side by side a repeated value would make an alias silently,
    its status lost: every name is its own member."""
    assert len(ErrorCode.__members__) == len(list(ErrorCode))
    for code in ErrorCode:
        assert code.value == code.name.lower(), code
        assert 400 <= code.http_status < 600, code


def test_the_wire_values_clients_rely_on_are_kept():
    """The strings clients see and the statuses they come with (docs/api.md) are the members'."""
    kept = {
        "INVALID_INPUT": ("invalid_input", 400),
        "INVALID_ARGUMENTS": ("invalid_arguments", 400),
        "NO_USABLE_MODEL": ("no_usable_model", 400),
        "TOKEN_MISSING": ("token_missing", 401),
        "TOKEN_INVALID": ("token_invalid", 401),
        "TOKEN_REVOKED": ("token_revoked", 401),
        "TOKEN_HOLDER_NOT_ALLOWED": ("token_holder_not_allowed", 401),
        "PERMISSION_DENIED": ("permission_denied", 403),
        "CONNECTION_NOT_FOUND": ("connection_not_found", 404),
        "METHOD_NOT_ALLOWED": ("method_not_allowed", 405),
        "STALE_DECISION": ("stale_decision", 409),
        "BODY_TOO_LARGE": ("body_too_large", 413),
        "UNKNOWN_FIELD": ("unknown_field", 422),
        "SERVER_ERROR": ("server_error", 500),
    }
    assert {name: (f"{ErrorCode[name]}", ErrorCode[name].http_status) for name in kept} == kept


# --- No literal codes: an AST scan of the app packages ----------------------------------------


def _modules():
    for app in APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            if "migrations" not in path.parts:
                yield path


def _error_classes(trees: dict[Path, ast.Module]) -> dict[str, str]:
    """The name of every ActhelmError class the packages define, with its module."""
    bases: dict[str, tuple[str, list[str]]] = {}
    for path, tree in trees.items():
        where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else Path(path.name)
        module = ".".join(where.with_suffix("").parts)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                names = [b.id if isinstance(b, ast.Name) else ast.unparse(b) for b in node.bases]
                bases[node.name] = (module, names)
    errors = {"ActhelmError": "core.exceptions"}
    grew = True
    while grew:
        grew = False
        for name, (module, names) in bases.items():
            if name not in errors and any(b.split(".")[-1] in errors for b in names):
                errors[name] = module
                grew = True
    return errors


def _is_literal(node: ast.expr) -> bool:
    """A string written at the call: a literal, an f-string, a sum of them, or a conditional
    with one on either side."""
    if isinstance(node, ast.IfExp):
        return _is_literal(node.body) or _is_literal(node.orelse)
    if isinstance(node, ast.BinOp):
        return _is_literal(node.left) or _is_literal(node.right)
    return isinstance(node, ast.JoinedStr) or (
        isinstance(node, ast.Constant) and isinstance(node.value, str)
    )


def literal_codes(trees: dict[Path, ast.Module], errors: dict[str, str]):
    """(where, what) for every code of an error written as a string, and every class that
    declares its code or status other than by a member of the registry; also the raises that
    name a member, as ("ok", class, member) to check their status."""
    for path, tree in trees.items():
        where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                func = node.func
                if isinstance(func, ast.Attribute) and func.attr == "passing":
                    func = func.value
                name = (
                    func.id
                    if isinstance(func, ast.Name)
                    else func.attr
                    if isinstance(func, ast.Attribute)
                    else None
                )
                if name not in errors:
                    continue
                for keyword in node.keywords:
                    if keyword.arg != "code":
                        continue
                    value = keyword.value
                    if _is_literal(value):
                        yield f"{where}:{node.lineno}", f"{name}(code={ast.unparse(value)})"
                    elif (
                        isinstance(value, ast.Attribute)
                        and isinstance(value.value, ast.Name)
                        and value.value.id == "ErrorCode"
                    ):
                        yield "ok", (name, value.attr, f"{where}:{node.lineno}")
            elif isinstance(node, ast.ClassDef) and node.name in errors:
                for statement in node.body:
                    targets = (
                        statement.targets
                        if isinstance(statement, ast.Assign)
                        else [statement.target]
                        if isinstance(statement, ast.AnnAssign)
                        else []
                    )
                    value = getattr(statement, "value", None)
                    for target in targets:
                        if not isinstance(target, ast.Name):
                            continue
                        if target.id == "http_status" or (
                            target.id in ("code", "error")
                            and value is not None
                            and _is_literal(value)
                        ):
                            yield f"{where}:{statement.lineno}", f"class {node.name}: {target.id}"


def _scan(paths):
    trees = {path: ast.parse(path.read_text()) for path in paths}
    errors = _error_classes(trees)
    return errors, list(literal_codes(trees, errors))


def test_no_error_is_raised_with_a_literal_code():
    errors, found = _scan(list(_modules()))
    literal = [f"{where} {what}" for where, what in found if where != "ok"]
    assert not literal, "name a member of core.exceptions.ErrorCode (or DeliveryCode):\n" + (
        "\n".join(literal)
    )
    named = [what for where, what in found if where == "ok"]
    assert len(named) >= 25  # the scan sees the raises (it would pass on nothing otherwise)
    # A code named at a raise keeps its class's status: the registry changed no answer.
    wrong = []
    for name, member, where in named:
        error = getattr(importlib.import_module(errors[name]), name)
        assert issubclass(error, ActhelmError)
        if ErrorCode[member].http_status != error.error.http_status:
            wrong.append(f"{where} {name}({member}): {error.error.http_status}")
    assert not wrong, "\n".join(wrong)


def test_every_error_class_names_a_member():
    errors, _found = _scan(list(_modules()))
    for name, module in errors.items():
        error = getattr(importlib.import_module(module), name)
        assert isinstance(error.error, ErrorCode), name
    assert len(errors) > 20


@pytest.mark.parametrize(
    "source",
    [
        'raise InvalidInput("no", code="tool_not_allowed")',
        'raise InvalidInput.passing("no", code="path_invalid")',
        'raise DeliveryFailed("no", code=f"http_{status}")',
        'raise DeliveryFailed("no", code="timeout" if slow else DeliveryCode.SMTP_ERROR)',
        'class Refused(InvalidInput):\n    code = "refused"',
        "class Refused(InvalidInput):\n    http_status = 418",
    ],
)
def test_the_scan_sees_a_literal_code(tmp_path, source):
    module = tmp_path / "m.py"
    prelude = "class InvalidInput(ActhelmError): ...\nclass DeliveryFailed(ActhelmError): ...\n"
    module.write_text(prelude + source + "\n")
    trees = {module: ast.parse(module.read_text())}
    found = [where for where, _what in literal_codes(trees, _error_classes(trees))]
    assert found and "ok" not in found
