"""The docs say what is true, as far as a machine can tell. Every doc in docs/, the README and
bench/README.md cites code, files, settings, commands and measured figures; each citation is
checked here against what it names, so that a rename, a removal, a changed default or a new
measurement fails here rather than leaving a doc that sends a reader nowhere, or the wrong way.

What is read as a citation, and what it is checked against:
- **code**, in backticks: a path with a slash under one of the project's folders (`tasks/`,
  `docs/`, `bench/`, …) ending in `/` or in a file extension the project keeps (.py, .html, .md,
  .sql, .toml, .yml, .yaml, .txt, .json, .css, .js, .png, .lock; an `#anchor` after it is left
  out): the file or folder exists. A path with a placeholder (`<id>`, `*`, `{…}`, `…`) is not
  checked;
- a test, `tests/x.py::test_name`: the file defines it; a migration, `agents/0019` or in words
  "migrations agents 0015, 0016 and 0021": the app has a migration of each number;
- a dotted name starting with a package (`agents.engine.store.fence.renew_leases`): the longest
  importable module prefix is imported and the rest resolves as attributes;
- a call `name()` or `Class.method` / `Class.method()`: a `def` or `class` of that name (the last
  part) is defined somewhere in the project's code;
- **a link** `[text](target)` to a file of the project (relative to the doc): the file exists,
  and its `#anchor`, if any, is a heading of that file (GitHub's slugs);
- **a setting**, in backticks: `ACTHELM_*` and `DJANGO_*` names (`=value`, `[…]` or `/…` after the
  name left out) are read by the project's code (the settings modules, or an `os.environ` read);
  a name ending in `_` or `_*` is a prefix some such name starts with. A default stated next to
  it — `` `ACTHELM_LEASE_SECONDS` (default 60) ``, `, default 0`, `default: …`, `on`/`off`/
  `empty` `by default` or `(the default)` — is the default the code gives it (units: s, minutes,
  hours, days for a `_SECONDS` setting; KB, MB, GB). A Django setting cited by name
  (`DATA_UPLOAD_MAX_MEMORY_SIZE`) with a stated default is checked against the project's value,
  and a Makefile variable (`PYTEST_WORKERS`, default 4) against the Makefile's `?=`;
- **a command**, `manage.py NAME …` in backticks or on a line of a code block, and
  `` `acthelm_NAME --flag …` `` / `` `acthelm_NAME subcommand …` `` in backticks: the command
  exists, every option (`--json`, `-o`) is one its parser (`create_parser`) or the subcommand's
  accepts, and the first word where a subcommand goes is one of its subcommands. An option in
  backticks with a default stated beside it (`` `--workers` (default 1) ``) has that default in
  the parser of the command the doc named last before it that has the option;
- **a make target**, `make NAME` in backticks or at the start of a code block's line: the
  Makefile defines it;
- **a figure from a benchmark**: a citation `` `bench/results/NAME.json#/json/pointer` `` (RFC 6901;
  a list's item by its index) checks the last number written before it in the same line: the
  recorded value, rounded to the figure's decimals, is the figure (`1,313` or `2.03` or `**1.00**`
  followed by `(`bench/results/steps.json#/capacity_inputs/commits`)`).
Anything else in backticks (SQL, values, other programs) is not a citation.
"""

import argparse
import ast
import importlib
import json
import re
import shlex
import unicodedata
from collections.abc import Iterator
from functools import cache
from itertools import chain
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Log lines the docs cite by name ("the `tasks.pruned` log line"), not modules.
LOG_EVENTS = frozenset({"tasks.pruned"})
PACKAGES = (
    "acthelm_site",
    "console",
    "schedules",
    "agents",
    "approvals",
    "tasks",
    "memory",
    "core",
)
FOLDERS = (*PACKAGES, "templates", "tests", "bench", "bin", "docs")
EXTENSIONS = (".py", ".html", ".md", ".sql", ".toml", ".yml", ".yaml", ".txt", ".json", ".css")
EXTENSIONS += (".js", ".png", ".lock", ".example")
DOCS = (
    *tuple(sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))),
    "README.md",
    "bench/README.md",
)

TICKED = re.compile(r"`([^`\n]+)`")
PATH = re.compile(rf"^(?:{'|'.join(FOLDERS)})/[\w/.\-#]*$")
DOTTED = re.compile(rf"^(?:{'|'.join(PACKAGES)})(?:\.\w+)+$")
CALL = re.compile(r"^(?:[A-Za-z_]\w*\.)?([A-Za-z_]\w*)\(\)$")
METHOD = re.compile(r"^([A-Z]\w*)\.([a-z_]\w*)$")
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
PLACEHOLDER = re.compile(r"[<>*{}…]")


# SQL's own functions, cited in the docs' SQL.
SQL_FUNCTIONS = frozenset(
    {"now", "count", "min", "max", "coalesce", "greatest", "least", "jsonb_array_elements"}
)


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
def parsed_sources() -> tuple[tuple[Path, ast.Module], ...]:
    """Every module of the project's packages (migrations aside), parsed once."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" not in path.parts:
                found.append((path, ast.parse(path.read_text())))
    return tuple(found)


@cache
def definitions() -> tuple[frozenset[str], dict[str, set[str]]]:
    """Every function, method and class name defined in the project's code, and each class's
    members (its methods, the names its body assigns — fields, constants — and the
    attributes its methods set on `self`)."""
    names: set[str] = set()
    members: dict[str, set[str]] = {}
    for _path, tree in parsed_sources():
        for node in ast.walk(tree):
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


TEST_ID = re.compile(rf"^((?:{'|'.join(FOLDERS)})/[\w/.\-]+\.py)::(\w+)(?:::(\w+))?$")
MIGRATION = re.compile(rf"^({'|'.join(PACKAGES)})/(\d{{4}})$")
MIGRATIONS_IN_WORDS = re.compile(r"\bmigrations? ([a-z_]+) ((?:\d{4}(?:, | and )?)+)")


def migration_problem(app: str, number: str) -> str | None:
    """`agents/0019`, "migration agents 0021": the app has a migration of that number."""
    if not list((ROOT / app / "migrations").glob(f"{number}_*.py")):
        return f"no migration {app}/{number}"
    return None


def problem(cited: str) -> str | None:
    """Why `cited` names nothing that exists; None when it does, or is not a citation."""
    text = cited.strip()
    if match := TEST_ID.match(text):  # tests/x.py::test_name (or ::Class::test_name)
        path, *names = (g for g in match.groups() if g)
        if not (ROOT / path).exists():
            return f"no file {path}"
        source = (ROOT / path).read_text()
        for name in names:
            if not re.search(rf"^\s*(?:async def|def|class) {name}\b", source, re.M):
                return f"{path} defines no {name}"
        return None
    if match := MIGRATION.match(text):
        return migration_problem(*match.groups())
    if PATH.match(text):
        return path_problem(text)
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
        if name in names or name in SQL_FUNCTIONS or _library_function(text.removesuffix("()")):
            return None
        return f"no def or class named {name}"
    return None


def _library_function(dotted: str) -> bool:
    """`time.thread_time`: a function of a module outside the project."""
    module, _, name = dotted.rpartition(".")
    if not module or module.split(".")[0] in PACKAGES:
        return False
    try:
        return hasattr(importlib.import_module(module), name)
    except ImportError:
        return False


# --- files and links -------------------------------------------------------------------------


def path_problem(text: str) -> str | None:
    """A project path: the file or folder exists (an `#anchor` or a bench pointer aside)."""
    if PLACEHOLDER.search(text):
        return None
    path = text.split("#", 1)[0]
    if not (path.endswith("/") or path.endswith(EXTENSIONS)):
        return None  # a module path (`agents/0019`), a prefix: not a file citation
    return None if (ROOT / path.rstrip("/")).exists() else f"no file or folder {path}"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to
    hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    text = "".join(c for c in text if c in " -" or unicodedata.category(c)[0] in "LN" or c == "_")
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    found: set[str] = set()
    fenced = False
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)):
            base, n = slug(m.group(1)), 1
            name = base
            while name in found:  # GitHub numbers a repeated heading's anchor
                name, n = f"{base}-{n}", n + 1
            found.add(name)
    return frozenset(found)


def link_problem(doc: str, target: str) -> str | None:
    """A link to a file of the project (relative to the doc): it exists, with its anchor."""
    if re.match(r"^[a-z][a-z0-9+.\-]*:", target):  # http:, mailto:, …
        return None
    file, _, anchor = target.partition("#")
    path = (ROOT / doc).parent / file if file else ROOT / doc
    if not path.exists():
        return f"no file {file}"
    if anchor and path.suffix == ".md" and anchor not in anchors(path.resolve()):
        return f"no heading #{anchor} in {path.resolve().relative_to(ROOT)}"
    return None


# --- settings --------------------------------------------------------------------------------

SETTING = re.compile(r"^((?:ACTHELM|DJANGO)_[A-Z0-9_]*)(\*|…)?(?:$|[=\[/])")
ENV_READERS = frozenset({"env_int", "env_float", "env_bool", "env_list", "getenv"})
SETTINGS_MODULES = ("acthelm_site/settings.py", "acthelm_site/settings_production.py")
# Names Django itself reads from the environment.
DJANGO_OWN = frozenset({"DJANGO_SETTINGS_MODULE", "DJANGO_ALLOW_ASYNC_UNSAFE"})


def _env_read(node: ast.Call) -> tuple[str, ast.expr | None] | None:
    """`(NAME, default expression)` of `env_int("NAME", default)`, `os.environ.get("NAME", …)`,
    `os.getenv(…)`; None for any other call."""
    func = node.func
    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
    reads_environ = (
        name == "get"
        and isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Attribute | ast.Name)
        and getattr(func.value, "attr", getattr(func.value, "id", None)) == "environ"
    )
    if not (name in ENV_READERS or reads_environ) or not node.args:
        return None
    first = node.args[0]
    if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
        return None
    default = node.args[1] if len(node.args) > 1 else None
    for keyword in node.keywords:
        if keyword.arg == "default":
            default = keyword.value
    return first.value, default


@cache
def setting_names_and_defaults() -> tuple[frozenset[str], dict[str, object]]:
    """The `ACTHELM_*`/`DJANGO_*` names the code reads (every string literal of that shape in
    the project's code), and for those read from the environment with a default, that default:
    a Python value where it is a literal, else the default's source text (`BASE_DIR /
    "staticfiles"`). The settings modules come last, so their defaults win."""
    names: set[str] = set(DJANGO_OWN)
    defaults: dict[str, object] = {}
    modules = [p for p in parsed_sources() if str(p[0].relative_to(ROOT)) not in SETTINGS_MODULES]
    modules += [(ROOT / m, ast.parse((ROOT / m).read_text())) for m in SETTINGS_MODULES]
    # A name a default falls back on, as the settings module that assigns it first does
    # (settings_production's `STATIC_ROOT = … or STATIC_ROOT` means settings.py's).
    assigned: dict[str, ast.expr] = {}
    for path, tree in modules:
        own = {
            t.id: node.value
            for node in tree.body
            if isinstance(node, ast.Assign)
            for t in node.targets
            if isinstance(t, ast.Name)
        }
        if str(path.relative_to(ROOT)) in SETTINGS_MODULES:
            assigned = own | assigned
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and SETTING.match(node.value)
            ):
                names.add(node.value)
            if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
                # `os.environ.get("NAME") or FALLBACK`: the fallback is the default
                read = isinstance(node.values[0], ast.Call) and _env_read(node.values[0])
                if read and read[1] is None:
                    defaults[read[0]] = _default_value(node.values[1], assigned)
            if isinstance(node, ast.Call) and (read := _env_read(node)) and read[1] is not None:
                defaults[read[0]] = _default_value(read[1], assigned)
        # a setting of that name not read from the environment
        names.update(name for name in own if SETTING.match(name))
    for path in sorted((ROOT / "bench").glob("*.py")):  # what the benchmarks read
        names.update(re.findall(r"""["']((?:ACTHELM|DJANGO)_[A-Z0-9_]+)["']""", path.read_text()))
    from tasks.limits import LIMITS  # the limits' defaults live in their table

    for limit in LIMITS:
        names.add(limit.setting)
        defaults.setdefault(limit.setting, limit.default)
    return frozenset(names), defaults


def _default_value(node: ast.expr, assigned: dict[str, ast.expr]) -> object:
    if isinstance(node, ast.Name) and node.id in assigned:
        node = assigned[node.id]
    try:
        return ast.literal_eval(node)
    except ValueError:
        return Expr(ast.unparse(node))


UNIT = r"(?:\s*(?:s|KB|MB|GB|minutes?|hours?|days?)\b)?"
WORD = r"(?:on|off|empty|true|false)\b"
NUMBER = rf"\d+(?:,\s*\d+)+(?:\s*s\b)?|\d[\d_]*(?:\.\d+)?{UNIT}"
STATED_DEFAULT = re.compile(
    # "(default 60)", ", default: `x`", "defaults to 5 s", "default `A` and …" (the first items)
    rf"^[^`|;]{{0,60}}?\bdefaults?(?: is| to|:)?\s+(?P<value>`[^`]+`|{NUMBER}|{WORD})"
    r"(?P<more>\s+and\b)?"
    # "off by default", "empty (the default)"
    r"|^[^`|;]{0,60}?\b(?P<word>on|off|empty)\s+(?:by default|\(the default\))"
    # right after the name: "(60 s)", ", 10 s)", " 0 —", "(86400, one day)", "(`x`;"
    rf"|^(?:\s*\(|,\s*|\s+)(?P<bare>{NUMBER}|{WORD})(?=$|[\s),:;.—])"
    r"|^\s*\(`(?P<ticked>[^`]+)`(?=[),;])"
    # "=60,300, the last", "=https://slack.com/api and", "=10)"
    r"|^=(?P<eq>[^\s)`]+?)(?=$|[\s)]|[,:;]\s)"
)
UNITS = {"s": 1, "kb": 1_000, "mb": 1_000_000, "gb": 1_000_000_000}
UNITS |= {"minute": 60, "minutes": 60, "hour": 3600, "hours": 3600, "day": 86400, "days": 86400}
WORDS = {"on": True, "off": False, "true": True, "false": False}


class Expr(str):
    """A default that is not a literal (`BASE_DIR / "staticfiles"`), as its source text."""


def stated_default(after: str, *, keyword_only: bool = False) -> str | None:
    """The default the text right after a setting's name states for it, as written; None when
    it states none (or one in words a machine cannot compare, "one year", "the `DATABASE_URL`").
    `keyword_only`: only a default the text calls one."""
    match = STATED_DEFAULT.match(re.sub(r"^\s*\|", "", after))  # a table row's next cell
    if not match or (keyword_only and not (match.group("value") or match.group("word"))):
        return None
    value = next(v for v in match.group("value", "word", "bare", "ticked", "eq") if v)
    value = value.strip("`").rstrip(".,:;")
    # "default `A` and the well-known …": the list's first items, the rest in words
    return value + (" …" if match.group("more") else "")


def default_matches(stated: str, actual: object, name: str) -> bool:
    """Whether the default a doc states is the code's."""
    words = stated.lower()
    if words == "empty":
        return actual in ("", [], (), None)
    if isinstance(actual, bool) or words in WORDS:
        return WORDS.get(words, words in ("1", "yes")) == actual
    if isinstance(actual, list | tuple):
        listed = stated.removesuffix(" …").removesuffix(" s")
        items = [s.strip() for s in listed.split(",") if s.strip()]
        if stated.endswith(" …"):  # the first items named, the rest in words
            return items == [str(a) for a in actual][: len(items)]
        return items == [str(a) for a in actual]
    if isinstance(actual, int | float):
        m = re.fullmatch(r"(\d[\d,_]*(?:\.\d+)?)\s*([A-Za-z]+)?", stated)
        if not m:
            return False
        number = float(m.group(1).replace(",", "").replace("_", ""))
        unit = (m.group(2) or "").lower()
        if unit not in UNITS and unit:
            return False
        if unit and unit not in ("s", "kb", "mb", "gb") and not name.endswith("_SECONDS"):
            return False
        return number * UNITS.get(unit, 1) == float(actual)
    if isinstance(actual, Expr):  # the doc names its literal part
        return re.search(rf"""['"]{re.escape(stated.rstrip("/"))}/?['"]""", actual) is not None
    return stated == str(actual)


@cache
def make_variables() -> dict[str, str]:
    """The Makefile's variables a person may set (`PYTEST_WORKERS ?= 4`), with their defaults."""
    found = re.findall(r"^([A-Z][A-Z0-9_]*) \?= ?(.*)$", (ROOT / "Makefile").read_text(), re.M)
    return {name: value.strip() for name, value in found}


@cache
def django_setting_names() -> frozenset[str]:
    from django.conf import global_settings

    return frozenset(n for n in dir(global_settings) if n.isupper())


def setting_problem(cited: str, after: str) -> str | None:
    """Why a setting cited in backticks (followed in the doc by `after`) is wrong: it is not
    read by the code, or the default stated beside it is not the code's. None when it is right
    or not a setting."""
    text = cited.strip()
    if text in make_variables():
        stated = stated_default(after)
        actual = make_variables()[text]
        if stated is None or stated == actual:
            return None
        return f"{text}: the doc says default {stated}, the Makefile says {actual}"
    if text in django_setting_names():
        stated = stated_default(after, keyword_only=True)
        if stated is None:
            return None
        from django.conf import global_settings

        settings_module = importlib.import_module("acthelm_site.settings")
        actual = getattr(settings_module, text, getattr(global_settings, text))
        if default_matches(stated, actual, text):
            return None
        return f"{text}: the doc says default {stated}, the settings say {actual!r}"
    match = SETTING.match(text)
    if not match:
        return None
    name, wildcard = match.groups()
    names, defaults = setting_names_and_defaults()
    if name.startswith("ACTHELM_KEY_") and name != "ACTHELM_KEY_":
        return None  # a person's own credential's name (`ACTHELM_KEY_GITHUB`)
    if wildcard or name.endswith("_"):
        if not any(n.startswith(name) for n in names):
            return f"no setting starts with {name}"
        return None
    if name not in names:
        return f"no setting {name}"
    stated = stated_default(after) if text == name else None
    if stated is None or name not in defaults:
        return None
    if default_matches(stated, defaults[name], name):
        return None
    return f"{name}: the doc says default {stated}, the code says {defaults[name]!r}"


# --- commands and make targets ---------------------------------------------------------------

COMMAND_IN_TICKS = re.compile(r"^acthelm_\w+\s+[-\w]")
STOP_TOKENS = frozenset({"|", "||", "&&", ";", ">", ">>", "<", "&", "2>&1"})


@cache
def commands() -> dict[str, str]:
    from django.core.management import get_commands

    return get_commands()


@cache
def parser_for(name: str) -> argparse.ArgumentParser:
    from django.core.management import load_command_class

    return load_command_class(commands()[name], name).create_parser("manage.py", name)


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def command_problem(words: str) -> str | None:
    """Why `NAME args…` (what follows `manage.py`) is not a command line the project accepts:
    no such command, an option its parser (or the chosen subcommand's) does not have, a
    subcommand it does not have. Placeholders (`NAME`, `"$TASK"`, `…`) pass as values."""
    # `[--a|--b]`: optional alternatives; `a\|b` (in a table): alternative subcommands; a `|`
    # outside brackets is a shell pipe
    words = words.replace("\\|", "\x00")
    text = re.sub(
        r"\[([^\]]*)\]", lambda m: " " + m.group(1).replace("|", " ") + " ", words.split(" #", 1)[0]
    ).replace("|", " | ")
    try:
        tokens = shlex.split(text, comments=False)
    except ValueError:
        tokens = text.split()
    if not tokens:
        return None
    name = tokens[0]
    if name not in commands():
        return f"no command {name}"
    parsers = [parser_for(name)]
    subcommand_chosen = False
    skip = 0
    for token in tokens[1:]:
        if token in STOP_TOKENS or token.startswith(")"):
            break
        if skip:
            skip -= 1
            continue
        if token.startswith("-") and len(token) > 1 and not re.match(r"^-\d", token):
            option = token.split("=", 1)[0]
            action = next(
                (
                    p._option_string_actions[option]
                    for p in parsers
                    if option in p._option_string_actions
                ),
                None,
            )
            if action is None:
                where = f"{name} {parsers[-1].prog.split()[-1]}" if len(parsers) > 1 else name
                return f"{where} has no option {option}"
            if "=" not in token and action.nargs not in (0, "?", "*"):
                skip = 1 if action.nargs in (None, 1) else 0
            continue
        choices = _subcommands(parsers[-1])
        if choices and not subcommand_chosen:
            for alternative in token.split("\x00"):
                if alternative not in choices:
                    return f"{name} has no subcommand {alternative}"
            parsers.extend(choices[a] for a in token.split("\x00"))
            subcommand_chosen = not any(_subcommands(choices[a]) for a in token.split("\x00"))
    return None


def _actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """A parser's actions and its subcommands', all levels down."""
    found = list(parser._actions)
    for sub in _subcommands(parser).values():
        found += _actions(sub)
    return found


OPTION = re.compile(r"`(--[a-z][\w-]*)(?: [A-Z]+)?`")
COMMAND_NAMED = re.compile(r"(?:manage\.py |`)(acthelm_\w+)")


def option_default_problem(named: list[str], option: str, after: str) -> str | None:
    """Why the default a doc states for `option` is not its parser's. The option is the one of
    the command the doc named last before it that has such an option (`named`: the commands
    named before it, in order); no such command is a problem too."""
    stated = stated_default(after, keyword_only=True)
    if stated is None:
        return None
    for command in reversed(named):
        actions = [a for a in _actions(parser_for(command)) if option in a.option_strings]
        if not actions:
            continue
        if any(default_matches(stated, a.default, option.upper()) for a in actions):
            return None
        default = actions[0].default
        return f"{command} {option}: the doc says default {stated}, the parser says {default!r}"
    return f"no command named before it has an option {option}"


def option_defaults_problems(text: str) -> list[tuple[str, str]]:
    """Every option cited in backticks with a default beside it, checked against the commands
    the doc named before it (`manage.py acthelm_eval …`, `` `acthelm_eval` ``)."""
    named = [(m.start(), m.group(1)) for m in COMMAND_NAMED.finditer(text)]
    found = []
    for m in OPTION.finditer(text):
        before = [name for at, name in named if at < m.start() and name in commands()]
        after = text[m.end() : m.end() + 80].replace("\n", " ")
        if before and (why := option_default_problem(before, m.group(1), after)):
            found.append((m.group(1), why))
    return found


@cache
def make_targets() -> frozenset[str]:
    found: set[str] = set()
    for line in (ROOT / "Makefile").read_text().splitlines():
        if m := re.match(r"^([A-Za-z0-9_.\- ]+?)\s*:(?!=)", line):
            found.update(m.group(1).split())
    return frozenset(found)


def make_problem(words: str) -> str | None:
    """Why `make X …` names a target the Makefile does not have (`VAR=value` words aside)."""
    for word in words.split(" #", 1)[0].split():
        if word in STOP_TOKENS:
            break
        if "=" in word or word.startswith("-"):
            continue
        if word not in make_targets():
            return f"the Makefile has no target {word}"
    return None


# --- figures from the benchmarks -------------------------------------------------------------

BENCH_CITATION = re.compile(r"^bench/results/([\w.\-]+\.json)#(/.*)$")
FIGURE = re.compile(r"(?<![\w.])(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(?![\w])")


@cache
def bench_result(file: str) -> object:
    return json.loads((ROOT / "bench" / "results" / file).read_text())


def recorded(file: str, pointer: str) -> object:
    """The value at a JSON pointer (RFC 6901) in bench/results/<file>; KeyError when absent."""
    value = bench_result(file)
    for raw in pointer.split("/")[1:]:
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(value, list):
            if not part.isdigit() or int(part) >= len(value):
                raise KeyError(pointer)
            value = value[int(part)]
        elif isinstance(value, dict) and part in value:
            value = value[part]
        else:
            raise KeyError(pointer)
    return value


def figure_problem(cited: str, before: str) -> str | None:
    """Why the figure written before a `bench/results/…#/pointer` citation (`before`: the line
    up to the citation) is not the recorded value: no such result, no figure, or another one."""
    match = BENCH_CITATION.match(cited.strip())
    if not match:
        return None
    file, pointer = match.groups()
    if not (ROOT / "bench" / "results" / file).exists():
        return f"no bench/results/{file}"
    try:
        value = recorded(file, pointer)
    except KeyError:
        return f"bench/results/{file} has no {pointer}"
    figures = FIGURE.findall(TICKED.sub(" ", before))
    if not figures:
        return f"no figure before bench/results/{file}#{pointer}"
    whole, decimals = figures[-1]
    written = f"{whole}{decimals}"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"bench/results/{file}#{pointer} is {value!r}, not a number"
    places = len(decimals) - 1 if decimals else 0
    if float(written.replace(",", "")) != round(float(value), places):
        return f"the doc says {written}, bench/results/{file}#{pointer} records {value}"
    return None


# --- reading a doc ---------------------------------------------------------------------------


def code_block_lines(text: str) -> list[str]:
    """The lines inside the doc's fenced code blocks, a `\\`-continued line joined."""
    lines: list[str] = []
    fenced, pending = False, ""
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced, pending = not fenced, ""
            continue
        if fenced:
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            lines.append(pending + line)
            pending = ""
    return lines


Found = Iterator[tuple[str, str | None]]  # (what is cited, why it is wrong, or None)


def ticked_problems(text: str) -> Found:
    """What is cited in backticks: code, files, settings with their defaults, commands, make
    targets, figures."""
    lines = text.splitlines()
    for n, line in enumerate(lines):
        for m in TICKED.finditer(line):
            cited = m.group(1)
            yield cited, problem(cited)
            yield cited, figure_problem(cited, line[: m.start()])
            after = line[m.end() :]
            if len(after) < 60 and n + 1 < len(lines):  # a default on the paragraph's next line
                after += " " + lines[n + 1]
            yield cited, setting_problem(cited, after)
            words = cited.strip()
            if "manage.py " in words:
                yield cited, command_problem(words.split("manage.py ", 1)[1])
            elif COMMAND_IN_TICKS.match(words):
                yield cited, command_problem(words)
            if make := re.match(r"^(?:\w+=\S+\s+)*make\s+(.+)$", words):
                yield cited, make_problem(make.group(1))


def block_problems(text: str) -> Found:
    """Commands and make targets on the lines of code blocks."""
    for line in code_block_lines(text):
        if " manage.py " in f" {line}" or "/manage.py " in line:
            yield line.strip(), command_problem(line.split("manage.py ", 1)[1])
        if make := re.match(r"^\s*(?:\$ )?(?:\w+=\S+\s+)*make\s+(.+)$", line):
            yield line.strip(), make_problem(make.group(1))


def prose_problems(doc: str, text: str) -> Found:
    """Links, migrations named in words, options' stated defaults."""
    for m in LINK.finditer(text):
        yield m.group(1), link_problem(doc, m.group(1))
    for m in MIGRATIONS_IN_WORDS.finditer(text.replace("\n", " ")):
        if m.group(1) in PACKAGES:
            for number in re.findall(r"\d{4}", m.group(2)):
                yield m.group(0), migration_problem(m.group(1), number)
    yield from option_defaults_problems(text)


def doc_problems(doc: str, text: str) -> list[str]:
    found = chain(ticked_problems(text), block_problems(text), prose_problems(doc, text))
    return sorted({f"{doc}: `{cited}` — {why}" for cited, why in found if why})


@pytest.mark.parametrize("doc", DOCS)
def test_every_claim_a_doc_makes_holds(doc):
    wrong = doc_problems(doc, (ROOT / doc).read_text())
    assert not wrong, "the doc says what is not so:\n" + "\n".join(wrong)


# --- the checks catch what they are for -----------------------------------------------------


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
    assert problem("time.thread_time()") is None  # the standard library's
    assert problem("time.no_such_function()") == "no def or class named no_such_function"


def test_the_check_catches_a_migration_or_a_test_that_is_gone():
    assert problem("agents/0019") is None
    assert problem("agents/0999") == "no migration agents/0999"
    assert doc_problems("x.md", "in migrations agents 0015, 0016 and 0021.\n") == []
    assert doc_problems("x.md", "in migrations agents 0015, 0998\n") == [
        "x.md: `migrations agents 0015, 0998` — no migration agents/0998"
    ]
    assert problem("tests/test_docs.py::test_every_claim_a_doc_makes_holds") is None
    assert problem("tests/test_docs.py::test_no_such_test") == (
        "tests/test_docs.py defines no test_no_such_test"
    )
    assert problem("tests/no_such_file.py::test_x") == "no file tests/no_such_file.py"


def test_the_check_catches_a_file_of_any_kind_that_is_gone():
    assert problem("bench/README.md") is None
    assert problem("docs/operations.md#backups") is None
    assert problem("bench/results/steps.json") is None
    assert problem("bench/results/gone.json") == "no file or folder bench/results/gone.json"
    assert problem("docs/gone.md") == "no file or folder docs/gone.md"
    assert problem("agents/eval/cases/") is None
    assert problem("agents/eval/gone/") == "no file or folder agents/eval/gone/"
    assert problem("tests/gone.toml") == "no file or folder tests/gone.toml"
    assert problem("bench/results/<name>.json") is None  # a placeholder, not a file


def test_the_check_catches_a_link_or_an_anchor_that_is_gone():
    assert link_problem("docs/operations.md", "#backups") is None
    assert link_problem("docs/operations.md", "#no-such-heading") == (
        "no heading #no-such-heading in docs/operations.md"
    )
    assert link_problem("docs/worker.md", "operations.md#backups") is None
    assert link_problem("docs/worker.md", "gone.md") == "no file gone.md"
    assert link_problem("README.md", "https://example.com/x") is None


def test_the_check_catches_a_setting_that_is_gone_or_a_wrong_default():
    assert setting_problem("ACTHELM_LEASE_SECONDS", " (default 60) and") is None
    assert setting_problem("ACTHELM_LEASE_SECONDS", " (default 30) and") == (
        "ACTHELM_LEASE_SECONDS: the doc says default 30, the code says 60"
    )
    assert setting_problem("ACTHELM_NO_SUCH_SETTING", " is read") == (
        "no setting ACTHELM_NO_SUCH_SETTING"
    )
    assert setting_problem("ACTHELM_LIMIT_*", "") is None
    assert setting_problem("ACTHELM_NOWHERE_*", "") == "no setting starts with ACTHELM_NOWHERE_"
    assert setting_problem("ACTHELM_COOLDOWN_SECONDS", ", default 30 minutes.") is None
    assert setting_problem("ACTHELM_COOLDOWN_SECONDS", ", default 20 minutes.") is not None
    assert setting_problem("ACTHELM_MCP_MAX_RESULT_BYTES", " (default 1 MB) ends") is None
    assert setting_problem("ACTHELM_MCP_MAX_RESULT_BYTES", " (default 2 MB) ends") is not None
    assert setting_problem("ACTHELM_FETCH_ALLOW_PRIVATE", " is on (it is off by default") is None
    assert setting_problem("ACTHELM_FETCH_ALLOW_PRIVATE", " is off (it is on by default") == (
        "ACTHELM_FETCH_ALLOW_PRIVATE: the doc says default on, the code says False"
    )
    assert (
        setting_problem("DJANGO_ALLOWED_HOSTS", " | names (default `localhost,127.0.0.1`)") is None
    )
    assert setting_problem("DJANGO_ALLOWED_HOSTS", " | names (default `localhost`)") is not None
    assert setting_problem("DJANGO_STATIC_ROOT", " | where (default `staticfiles/`) |") is None
    assert setting_problem("DJANGO_STATIC_ROOT", " | where (default `static/`) |") is not None
    assert setting_problem("ACTHELM_MCP_EXECUTABLES", " | …; empty (the default): only") is None
    assert setting_problem("CONN_MAX_AGE", "") is None  # a Django setting, no default stated
    assert setting_problem("PYTEST_WORKERS", ", default 4)") is None  # the Makefile's
    assert setting_problem("PYTEST_WORKERS", ", default 2)") == (
        "PYTEST_WORKERS: the doc says default 2, the Makefile says 4"
    )
    assert setting_problem("DATA_UPLOAD_MAX_MEMORY_SIZE", " (default 1) is") is not None


def test_the_check_catches_a_command_or_an_option_that_is_gone():
    assert command_problem("acthelm_worker --concurrency 4 --burst") is None
    assert command_problem("acthelm_worker --no-such-flag") == (
        "acthelm_worker has no option --no-such-flag"
    )
    assert command_problem("acthelm_no_such_command") == "no command acthelm_no_such_command"
    assert command_problem('acthelm_task --json create --title "x"') is None
    assert (
        command_problem("acthelm_task frobnicate 3") == "acthelm_task has no subcommand frobnicate"
    )
    assert command_problem("acthelm_goal list [--active|--inactive]") is None
    assert (
        command_problem("acthelm_goal list --everything")
        == "acthelm_goal list has no option --everything"
    )
    assert command_problem("check --deploy") is None
    errors = doc_problems("x.md", "Run `acthelm_worker --concurency 4`.\n")
    assert errors == [
        "x.md: `acthelm_worker --concurency 4` — acthelm_worker has no option --concurency"
    ]
    block = "```sh\n.venv/bin/python manage.py acthelm_worker \\\n  --bogus\n```\n"
    assert len(doc_problems("x.md", block)) == 1


def test_the_check_catches_an_options_wrong_default():
    text = "`acthelm_eval` starts `--workers` (default {}) processes.\n"
    assert doc_problems("x.md", text.format(1)) == []
    assert doc_problems("x.md", text.format(3)) == [
        "x.md: `--workers` — acthelm_eval --workers: the doc says default 3, the parser says 1"
    ]
    named = ["acthelm_prune", "acthelm_task"]  # the last named has no --batch-size
    assert option_default_problem(named, "--batch-size", " tasks (default 500)") is None
    assert option_default_problem(named, "--batch-size", " tasks (default 50)") is not None
    assert option_default_problem(named, "--batch", " (default 500)") == (
        "no command named before it has an option --batch"
    )


def test_the_check_catches_a_make_target_that_is_gone():
    assert make_problem("test") is None
    assert make_problem("no-such-target") == "the Makefile has no target no-such-target"
    assert doc_problems("x.md", "`PYTEST_WORKERS=1 make test`\n") == []
    assert doc_problems("x.md", "```\nmake nothing-here   # what\n```\n") == [
        "x.md: `make nothing-here   # what` — the Makefile has no target nothing-here"
    ]


def test_the_check_catches_a_figure_the_benchmark_did_not_record():
    commits = recorded("steps.json", "/capacity_inputs/commits")
    assert isinstance(commits, int | float)
    cite = "`bench/results/steps.json#/capacity_inputs/commits`"
    assert doc_problems("x.md", f"a step is **{commits:.2f}** commits ({cite})\n") == []
    wrong = doc_problems("x.md", f"a step is **{commits + 1:.2f}** commits ({cite})\n")
    assert len(wrong) == 1 and "records" in wrong[0]
    assert figure_problem("bench/results/steps.json#/no/such/key", "1.0 ") == (
        "bench/results/steps.json has no /no/such/key"
    )
    assert figure_problem("bench/results/gone.json#/a", "1.0 ") == "no bench/results/gone.json"
    assert figure_problem("bench/results/steps.json#/capacity_inputs/commits", "commits ") == (
        "no figure before bench/results/steps.json#/capacity_inputs/commits"
    )
    # thousands separators and rounding to the figure's decimals
    agents = recorded("steps.json", "/capacity/0/agents_pooled")
    assert isinstance(agents, float)
    written = f"{round(agents):,}"
    assert figure_problem("bench/results/steps.json#/capacity/0/agents_pooled", written) is None
