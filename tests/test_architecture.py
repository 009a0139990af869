"""The layering of docs/architecture.md, kept by the import contracts in pyproject.toml (run by
`make test` as `lint-imports`), and the rule that goes with it: an app imports another at the top
of a module, never inside a function to dodge a cycle. The contracts see imports inside functions
too; this test makes the second rule a check."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APPS = ("acthelm_site", "console", "schedules", "agents", "approvals", "tasks", "memory", "core")
# Where an import inside a function is the rule rather than a dodge: Django's AppConfig.ready()
# (the app registry is not ready at import time), and the embedded PostgreSQL, which imports the
# pgserver package only when no DATABASE_URL is set.
ALLOWED = {
    ("agents/apps.py", "ready"),
    ("approvals/apps.py", "ready"),
    ("schedules/apps.py", "ready"),
    ("acthelm_site/settings.py", "_database_url"),
}


def _imports_inside_functions(path: Path):
    tree = ast.parse(path.read_text())
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                if name.split(".")[0] in APPS:
                    yield function.name, node.lineno, name


def _modules():
    for app in APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            if "migrations" not in path.parts:
                yield path


def test_no_app_is_imported_inside_a_function():
    found = []
    for path in _modules():
        relative = str(path.relative_to(ROOT))
        found += [
            f"{relative}:{line} {function}() imports {name}"
            for function, line, name in _imports_inside_functions(path)
            if (relative, function) not in ALLOWED
        ]
    assert not found, "import at the top of the module instead:\n" + "\n".join(found)


def test_the_check_sees_an_import_inside_a_function(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from tasks.services import act\n    return act\n")
    assert list(_imports_inside_functions(module)) == [("f", 2, "tasks.services")]
