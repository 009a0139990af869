"""The docs name code that exists. Every doc in docs/ and the README cites modules, files,
functions, classes, permissions and models in backticks (`tasks/transitions.py`,
`agents.engine.store`, `renew_leases()`, `Recorder.commit`); each of those must still be there,
so that a rename or a removal fails here rather than leaving a doc that sends a reader nowhere.

What is read as a citation:
- a path with a slash ending in `.py`, `.html` or `/` under one of the packages: the file or
  folder exists;
- a dotted name starting with a package (`agents.engine.store.fence.renew_leases`): the longest
  importable module prefix is imported and the rest resolves as attributes;
- a call `name()` or `Class.method` / `Class.method()`: a `def` or `class` of that name (the last
  part) is defined somewhere in the project's code.
Anything else in backticks (SQL, settings, values, commands) is not a citation.
"""

import ast
import importlib
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Log lines the docs cite by name ("the `tasks.pruned` log line"), not modules.
LOG_EVENTS = frozenset({"tasks.pruned"})
PACKAGES = ("acthelm_site", "console", "agents", "approvals", "tasks", "memory", "core")
DOCS = (*tuple(sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))), "README.md")

TICKED = re.compile(r"`([^`\n]+)`")
PATH = re.compile(rf"^(?:{'|'.join(PACKAGES)}|templates|tests|bench|bin)/[\w/.\-]*$")
DOTTED = re.compile(rf"^(?:{'|'.join(PACKAGES)})(?:\.\w+)+$")
CALL = re.compile(r"^(?:[A-Za-z_]\w*\.)?([A-Za-z_]\w*)\(\)$")
METHOD = re.compile(r"^([A-Z]\w*)\.([a-z_]\w*)$")


# SQL's own functions, cited in the docs' SQL.
SQL_FUNCTIONS = frozenset({"now", "count", "min", "max", "coalesce", "greatest", "least"})


def _attributes_set_on_self(method: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(method):
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            if (
                isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name)
                and target.value.id == "self"
            ):
                found.add(target.attr)
    return found


@cache
def definitions() -> tuple[frozenset[str], dict[str, set[str]]]:
    """Every function, method and class name defined in the project's code, and each class's
    members (its methods, the names its body assigns — fields, constants — and the
    attributes its methods set on `self`)."""
    names: set[str] = set()
    members: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    names.add(node.name)
                if isinstance(node, ast.ClassDef):
                    own = members.setdefault(node.name, set())
                    for item in node.body:
                        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                            own.add(item.name)
                            own.update(_attributes_set_on_self(item))
                        elif isinstance(item, ast.Assign):
                            own.update(t.id for t in item.targets if isinstance(t, ast.Name))
                        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                            own.add(item.target.id)
    return frozenset(names), members


@cache
def permissions_and_models() -> frozenset[str]:
    """`app_label.codename` of every permission the models declare (Django's four and their
    own), and `app_label.Model` of every model: the docs cite both."""
    from django.apps import apps

    found: set[str] = set()
    for model in apps.get_models():
        meta = model._meta
        found.add(f"{meta.app_label}.{model.__name__}")
        found.update(f"{meta.app_label}.{a}_{meta.model_name}" for a in meta.default_permissions)
        found.update(f"{meta.app_label}.{codename}" for codename, _ in meta.permissions)
    return frozenset(found)


def resolves(dotted: str) -> bool:
    if dotted in permissions_and_models():
        return True
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(target, attribute):
                return False
            target = getattr(target, attribute)
        return True
    return False


def problem(cited: str) -> str | None:
    """Why `cited` names nothing that exists; None when it does, or is not a citation."""
    text = cited.strip()
    if PATH.match(text):
        path = text.rstrip("/")
        if text.endswith((".py", ".html", "/")) and not (ROOT / path).exists():
            return f"no file or folder {text}"
        return None
    if text in LOG_EVENTS:
        return None
    if DOTTED.match(text.removesuffix("()")):
        return None if resolves(text.removesuffix("()")) else f"{text} does not resolve"
    names, members = definitions()
    if match := METHOD.match(text.removesuffix("()")):
        cls, name = match.groups()
        if cls not in members:
            return None  # not a class of ours (a library's, or not a citation)
        return None if name in members[cls] else f"class {cls} has no {name}"
    if match := CALL.match(text):
        name = match.group(1)
        if name in names or name in SQL_FUNCTIONS:
            return None
        return f"no def or class named {name}"
    return None


@pytest.mark.parametrize("doc", DOCS)
def test_every_name_a_doc_cites_exists(doc):
    missing = sorted(
        {
            f"{doc}: `{c}` — {why}"
            for c in TICKED.findall((ROOT / doc).read_text())
            if (why := problem(c))
        }
    )
    assert not missing, "the doc cites code that is gone:\n" + "\n".join(missing)


def test_the_check_catches_a_name_that_is_gone():
    assert problem("tasks/transitions.py") is None
    assert problem("tasks/no_such_module.py") == "no file or folder tasks/no_such_module.py"
    assert problem("agents.engine.store.fence.renew_leases") is None
    assert problem("agents.engine.store.fence.no_such_function") is not None
    assert problem("renew_leases()") is None
    assert (
        problem("no_such_function_anywhere()") == "no def or class named no_such_function_anywhere"
    )
    assert problem("Recorder.commit") is None
    assert problem("Recorder.no_such_method") == "class Recorder has no no_such_method"
    assert problem("SELECT 1") is None  # not a citation
