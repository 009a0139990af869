"""A JSON Schema written by someone else (an MCP server's input schema), applied offline.

jsonschema, left to itself, resolves a ``$ref`` it cannot find inside the schema by fetching
it (``urlopen``: ``http://``, ``file:///``) — while the worker checks a model's arguments, before
any person approved the call, with the fetched document echoed in the refusal. Here every
reference resolves only inside the schema: a ``referencing`` registry whose retrieval always
fails, handed to every validator (never the deprecated ``RefResolver``).

Two doors, one set of rules:

* ``schema_refusal(schema)`` — when a server is tested or its recorded tools are read: a schema
  that reaches outside itself, or that could cost more than a check may spend (below), is
  ``schema_not_allowed``; one that is not valid JSON Schema, too large or too deep, or that
  cannot be applied even to ``{}`` is ``schema_invalid``. Its tool is not offered.
* ``OutsideSchema.errors(arguments)`` — every argument check: the validation errors, or
  ``UnusableSchema`` when the schema itself cannot be applied (a loop of references, an unknown
  type, a reference to nowhere), ``TooCostly`` when checking these arguments would take more
  than its share of CPU or memory, ``CheckStopped`` when the caller's ``should_stop`` said so
  (a cancel, a lost lease). It never raises anything else.

What a schema may cost is judged at both doors. At listing: every ``pattern`` must compile in
RE2 (linear time) within ``RE2_MAX_MEM``, at most ``MAX_PATTERNS`` of them; ``required``,
``enum``, ``properties`` and ``dependentRequired`` hold at most ``MAX_NAMES`` entries; and the
schemas ``$ref``/``allOf``/``anyOf``/``oneOf``/``not``/``if`` apply to one place of the arguments
number at most ``MAX_FAN_OUT`` — otherwise ``schema_not_allowed``. At every check: the patterns
compiled once per ``OutsideSchema`` (never per application), ``uniqueItems`` in linear time
(hashing a canonical form of each item), and a budget of keyword steps, thread CPU time
(``MAX_CHECK_CPU_SECONDS``; a full garbage collection that lands in a check is not its cost) and
bytes of the errors it makes (``MAX_CHECK_BYTES``), polled every ``POLL_EVERY`` steps together
with ``should_stop``. ``patternProperties`` (with the
``additionalProperties`` beside it) is not enforced: the server still checks its own input.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import gc
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import jsonschema
import re2
import referencing
import referencing.exceptions
import referencing.jsonschema

SCHEMA_NOT_ALLOWED = "schema_not_allowed"  # it refers outside itself, or could cost too much
SCHEMA_INVALID = "schema_invalid"  # not valid JSON Schema, too large, or cannot be applied
#: One call's arguments would take more than the check's budget (CPU, memory, steps) to check.
ARGUMENTS_TOO_COSTLY = "arguments_too_costly"

#: A schema larger than this (as compact JSON) or nested deeper is refused when it is listed.
MAX_SCHEMA_BYTES = 256 * 1024
MAX_SCHEMA_DEPTH = 64
#: Keyword applications one argument check may make: references that fan out
#: (``allOf: [a, a]`` thirty levels deep) would otherwise take the worker's thread for ever.
MAX_CHECK_STEPS = 200_000
#: Thread CPU time one argument check may take, and bytes its errors may hold (each error
#: counted as ``ERROR_BYTES`` plus its message, which quotes the argument or the schema's value).
MAX_CHECK_CPU_SECONDS = 0.1
MAX_CHECK_BYTES = 64 * 1024 * 1024
ERROR_BYTES = 3 * 1024  # measured with tracemalloc: ~3 KiB an error, path and context
#: The check looks at its CPU time and at ``should_stop`` every this many steps (and as often
#: while it hashes the items of a ``uniqueItems`` array): a few hundred microseconds apart.
POLL_EVERY = 32
#: What a schema may hold, judged at listing (``schema_not_allowed`` past it).
MAX_PATTERNS = 100
RE2_MAX_MEM = 1024 * 1024  # a pattern RE2 cannot compile within this is refused
MAX_NAMES = 1_000  # entries of one required, enum, properties or dependentRequired
MAX_FAN_OUT = 1_000  # schemas applied, in place, to one place of the arguments
#: Keywords that apply their schemas to the same place of the arguments as the schema they
#: are in: a chain of them multiplies (``allOf: [a, a]`` thirty levels deep: 2**30).
_IN_PLACE_ONE = ("not", "if", "then", "else")
_IN_PLACE_MANY = ("allOf", "anyOf", "oneOf")

#: Keywords whose value is a reference; only ``#…`` (a place inside the schema) is allowed.
REFERENCE_KEYWORDS = ("$ref", "$dynamicRef", "$recursiveRef")
#: Keys whose value maps names to schemas: a keyword found there is a property's name.
_NAME_MAPS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies"}
)
#: Keys whose value is data, never a schema: nothing in them is resolved.
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})


class UnusableSchema(Exception):
    """The schema itself cannot be applied; ``str()`` says why, in a line, for the model."""


class _NotRetrieved(LookupError):
    pass


def _no_retrieval(uri: str) -> referencing.Resource[Any]:
    raise _NotRetrieved(uri)


#: The only registry a validator here gets: nothing but the schema itself (and the bundled
#: meta-schemas jsonschema adds) can be found; anything else is ``Unresolvable``.
OFFLINE: referencing.Registry[Any] = referencing.Registry(retrieve=_no_retrieval)  # type: ignore[call-arg]


# -- RE2 for ``pattern`` ------------------------------------------------------------------------

_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False
_RE2_OPTIONS.max_mem = RE2_MAX_MEM


def _re2(pattern: str) -> Any:  # a compiled RE2 pattern (re2 has no type hints), or None
    try:
        return re2.compile(pattern, options=_RE2_OPTIONS)
    except (re2.error, TypeError, ValueError):
        return None


def _re2_pattern(
    validator: jsonschema.protocols.Validator, pattern: Any, instance: Any, schema: dict[str, Any]
) -> Iterator[jsonschema.ValidationError]:
    """The ``pattern`` keyword: ``pattern`` and ``instance`` are whatever JSON the schema and the
    arguments hold. The pattern was compiled when the check was built (``_Check.patterns``)."""
    if not isinstance(pattern, str) or not validator.is_type(instance, "string"):
        return
    compiled = _running().pattern(pattern)
    if compiled is None:
        raise UnusableSchema(f"its pattern {_short(pattern)} is not one RE2 can compile")
    if compiled.search(instance) is None:
        yield jsonschema.ValidationError(f"{instance[:100]!r} does not match {pattern[:200]!r}")


# -- ``uniqueItems`` in linear time ---------------------------------------------------------------


def _canonical(value: Any, check: _Check) -> Any:
    """A hashable form of a JSON value, equal for values JSON Schema calls equal: ``1`` and
    ``1.0`` are one number, ``true`` is not ``1``, an object's key order does not count."""
    check.node()
    if isinstance(value, bool):
        return ("b", value)
    if isinstance(value, (int, float)):
        return ("n", value)  # Python's int and float compare and hash by value
    if isinstance(value, str):
        return ("s", value)
    if value is None:
        return ("z",)
    if isinstance(value, list):
        return ("a", tuple(_canonical(item, check) for item in value))
    if isinstance(value, dict):
        return ("o", frozenset((key, _canonical(item, check)) for key, item in value.items()))
    return ("?", repr(value))


def _unique_items(
    validator: jsonschema.protocols.Validator, unique: Any, instance: Any, schema: dict[str, Any]
) -> Iterator[jsonschema.ValidationError]:
    """The ``uniqueItems`` keyword with a set of canonical forms (jsonschema compares every pair:
    8,000 items took 151 s)."""
    if not unique or not validator.is_type(instance, "array"):
        return
    check = _running()
    seen: set[Any] = set()
    for index, item in enumerate(instance):
        try:
            form = _canonical(item, check)
        except RecursionError:
            raise TooCostly("an item is nested too deeply to compare") from None
        if form in seen:
            yield jsonschema.ValidationError(f"item {index} repeats an earlier item")
            return
        seen.add(form)


# -- the work bound -----------------------------------------------------------------------------


class TooCostly(Exception):
    """Checking these arguments would cost more than the check's budget; ``str()`` says which."""


class CheckStopped(Exception):
    """The caller's ``should_stop`` asked the check to stop (a cancel, a lost lease)."""


class _Check:
    """One running check's budget: steps, thread CPU time, bytes of errors, the caller's
    ``should_stop``; and the schema's compiled patterns."""

    def __init__(
        self,
        patterns: dict[str, Any],
        *,
        steps: int,
        cpu_seconds: float,
        max_bytes: int,
        should_stop: Callable[[], bool] | None,
    ) -> None:
        self.patterns = patterns
        self.steps = steps
        self.max_steps = steps
        self.cpu_seconds = cpu_seconds
        self.deadline = time.thread_time() + cpu_seconds
        self.collecting_since: float | None = None  # a full collection runs (`_uncharged_gc`)
        self.bytes_left = max_bytes
        self.max_bytes = max_bytes
        self.should_stop = should_stop
        self.until_poll = POLL_EVERY

    def step(self) -> None:
        self.steps -= 1
        if self.steps < 0:
            raise TooCostly(f"checking them takes more than {self.max_steps} keyword steps")
        self.node()

    def node(self) -> None:
        """One unit of work: every ``POLL_EVERY`` of them, the clock and ``should_stop``."""
        self.until_poll -= 1
        if self.until_poll > 0:
            return
        self.until_poll = POLL_EVERY
        if self.should_stop is not None and self.should_stop():
            raise CheckStopped
        if time.thread_time() > self.deadline:
            raise TooCostly(f"checking them takes more than {self.cpu_seconds:g} s of CPU")

    def keep(self, error: jsonschema.ValidationError) -> None:
        """An error the check holds (counted once, however many keywords pass it up)."""
        if getattr(error, "_acthelm_counted", False):
            return
        error._acthelm_counted = True  # type: ignore[attr-defined]
        self.node()  # a keyword may yield many (a long ``required``): each is work
        self.bytes_left -= ERROR_BYTES + len(error.message)
        if self.bytes_left < 0:
            raise TooCostly(
                f"checking them holds more than {self.max_bytes // (1024 * 1024)} MiB of errors"
            )

    def pattern(self, pattern: str) -> Any:
        if pattern not in self.patterns:  # not found when the check was built: once, here
            self.patterns[pattern] = _re2(pattern)
        return self.patterns[pattern]


_current = threading.local()


def _uncharged_gc(phase: str, info: dict[str, Any]) -> None:
    """A ``gc.callbacks`` hook: a full collection that lands inside a check moves the check's
    deadline by the CPU time it took. It runs in whichever thread allocates when one is due, and
    its cost is the whole heap's, not the check's: 75 ms in a fresh worker, over 100 ms in one
    holding thousands of runs — charged to the check, a cheap call was refused as too costly.
    (The young generations' collections are the check's own allocations: charged.)"""
    if info.get("generation") != 2:
        return
    check: _Check | None = getattr(_current, "check", None)
    if check is None:
        return
    if phase == "start":
        check.collecting_since = time.thread_time()
    elif check.collecting_since is not None:
        check.deadline += time.thread_time() - check.collecting_since
        check.collecting_since = None


gc.callbacks.append(_uncharged_gc)


def _running() -> _Check:
    check: _Check | None = getattr(_current, "check", None)
    if check is None:  # a keyword applied outside OutsideSchema.errors: no budget at all
        raise TooCostly("a check ran without a budget")
    return check


#: What stops a check in this context (a cancel, a lost lease), unless one is given: the engine
#: sets it around a call's admission (``stop_checks_when``).
_should_stop: contextvars.ContextVar[Callable[[], bool] | None] = contextvars.ContextVar(
    "acthelm_schema_should_stop", default=None
)


@contextlib.contextmanager
def stop_checks_when(should_stop: Callable[[], bool] | None) -> Iterator[None]:
    """Every argument check in this block polls ``should_stop`` and raises ``CheckStopped``."""
    token = _should_stop.set(should_stop)
    try:
        yield
    finally:
        _should_stop.reset(token)


type _Keyword = Callable[..., Any]


def _counted(keyword: _Keyword) -> _Keyword:
    """A keyword function that spends one step of the running check (``OutsideSchema.errors``)
    and counts the errors it yields against the check's bytes."""

    @functools.wraps(keyword)
    def counted(*args: Any) -> Any:
        check = _running()
        check.step()
        found = keyword(*args)
        if found is None:
            return None
        return _kept(found, check)

    return counted


def _kept(
    found: Iterator[jsonschema.ValidationError], check: _Check
) -> Iterator[jsonschema.ValidationError]:
    for error in found:
        check.keep(error)
        yield error


@functools.cache
def _validator_class(base: type[jsonschema.protocols.Validator]) -> Any:
    """``base`` with RE2 patterns, a linear ``uniqueItems`` and every keyword counted (one class
    per draft)."""
    keywords = {name: _counted(fn) for name, fn in base.VALIDATORS.items()}
    keywords["pattern"] = _counted(_re2_pattern)
    if "uniqueItems" in keywords:
        keywords["uniqueItems"] = _counted(_unique_items)
    # types-jsonschema leaves validators.extend without annotations.
    return jsonschema.validators.extend(base, keywords)  # type: ignore[no-untyped-call]


# -- the schema as it is checked ----------------------------------------------------------------


def _prepared(node: Any, parent: str = "") -> Any:
    """A copy of a schema for checking: ``$schema`` removed wherever it is a keyword (below the
    root jsonschema would switch to a stock validator with Python's backtracking ``re``; the
    root's draft is chosen before), and ``patternProperties`` (with the ``additionalProperties``
    / ``unevaluatedProperties`` that would depend on it) removed wherever it is a keyword."""
    if parent in _DATA_KEYWORDS:
        return node
    if isinstance(node, list):
        return [_prepared(item) for item in node]
    if not isinstance(node, dict):
        return node
    if parent in _NAME_MAPS:
        return {key: _prepared(value) for key, value in node.items()}
    out = {key: _prepared(value, key) for key, value in node.items() if key != "$schema"}
    if "patternProperties" in out:
        for key in ("patternProperties", "additionalProperties", "unevaluatedProperties"):
            out.pop(key, None)
    return out


def _keyword_nodes(node: Any) -> Iterator[dict[str, Any]]:
    """Every object of a (prepared) schema whose keys are keywords, without recursion."""
    stack: list[tuple[Any, str]] = [(node, "")]
    while stack:
        node, parent = stack.pop()
        if parent in _DATA_KEYWORDS:
            continue
        if isinstance(node, list):
            stack.extend((item, "") for item in node)
        elif isinstance(node, dict):
            if parent in _NAME_MAPS:
                stack.extend((value, "") for value in node.values())
                continue
            yield node
            stack.extend((value, key) for key, value in node.items())


def _draft(schema: dict[str, Any]) -> type[jsonschema.protocols.Validator]:
    draft: type[jsonschema.protocols.Validator] = jsonschema.validators.validator_for(
        schema, default=jsonschema.Draft202012Validator
    )
    return draft


class OutsideSchema:
    """A schema from outside, checked offline (``OFFLINE``), with RE2 and a work bound."""

    def __init__(
        self,
        schema: dict[str, Any],
        *,
        cpu_seconds: float = MAX_CHECK_CPU_SECONDS,
        max_steps: int = MAX_CHECK_STEPS,
        max_bytes: int = MAX_CHECK_BYTES,
    ) -> None:
        self.schema = schema
        self.cpu_seconds = cpu_seconds
        self.max_steps = max_steps
        self.max_bytes = max_bytes
        self._validator: jsonschema.protocols.Validator | None = None
        #: Each pattern compiled once, for every check of this schema.
        self.patterns: dict[str, Any] = {}

    def _build(self) -> jsonschema.protocols.Validator:
        if self._validator is None:
            cls = _validator_class(_draft(self.schema))
            prepared = _prepared(self.schema)
            for node in _keyword_nodes(prepared):
                pattern = node.get("pattern")
                if isinstance(pattern, str) and pattern not in self.patterns:
                    self.patterns[pattern] = _re2(pattern)
            self._validator = cls(prepared, registry=OFFLINE)
        return self._validator

    def errors(
        self, instance: Any, *, should_stop: Callable[[], bool] | None = None
    ) -> list[jsonschema.ValidationError]:
        """The ways ``instance`` breaks the schema, in path order. ``UnusableSchema`` when the
        schema cannot be applied, ``TooCostly`` past the budget, ``CheckStopped`` when
        ``should_stop`` (else the one ``stop_checks_when`` set) answers true; nothing else
        escapes (the schema is the server's, hostile)."""
        if should_stop is None:
            should_stop = _should_stop.get()
        try:
            validator = self._build()
        except Exception as exc:  # noqa: BLE001 - a hostile schema's failure becomes a coded refusal
            raise UnusableSchema(f"it cannot be applied ({type(exc).__name__})") from None
        _current.check = _Check(
            self.patterns,
            steps=self.max_steps,
            cpu_seconds=self.cpu_seconds,
            max_bytes=self.max_bytes,
            should_stop=should_stop,
        )
        try:
            found = list(validator.iter_errors(instance))
            found.sort(key=lambda e: [_sortable(p) for p in e.path])
            return found
        except (TooCostly, CheckStopped, UnusableSchema):
            raise
        except RecursionError:
            raise UnusableSchema("its references loop without end") from None
        except jsonschema.exceptions.UnknownType as exc:
            raise UnusableSchema(f"it names an unknown type {_short(exc.type)}") from None
        except referencing.exceptions.Unresolvable as exc:
            raise UnusableSchema(f"a reference does not resolve inside it: {_short(exc)}") from None
        except jsonschema.exceptions.SchemaError as exc:
            raise UnusableSchema(f"it is not valid JSON Schema: {_short(exc.message)}") from None
        except Exception as exc:  # noqa: BLE001 - a hostile schema's failure becomes a coded refusal
            raise UnusableSchema(f"it cannot be applied ({type(exc).__name__})") from None
        finally:
            _current.check = None


def _sortable(part: str | int) -> tuple[int, int, str]:
    return (0, part, "") if isinstance(part, int) else (1, 0, str(part))


def _short(value: Any, limit: int = 200) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


# -- when the schema is listed ------------------------------------------------------------------

type Refusal = tuple[str, str]  # (code, why)


def _walk(schema: dict[str, Any]) -> Refusal | None:
    """Depth, reference keywords and ``$schema``, without recursion."""
    stack: list[tuple[Any, str, int]] = [(schema, "", 1)]
    while stack:
        node, parent, depth = stack.pop()
        if depth > MAX_SCHEMA_DEPTH:
            return SCHEMA_INVALID, f"it is nested deeper than {MAX_SCHEMA_DEPTH} levels"
        if parent in _DATA_KEYWORDS:
            continue
        if isinstance(node, list):
            stack.extend((item, "", depth + 1) for item in node)
            continue
        if not isinstance(node, dict):
            continue
        if parent in _NAME_MAPS:  # names of properties or definitions, each holding a schema
            stack.extend((value, "", depth + 1) for value in node.values())
            continue
        for keyword in REFERENCE_KEYWORDS:
            if keyword not in node:
                continue
            ref = node[keyword]
            if not isinstance(ref, str):
                return SCHEMA_INVALID, f"its {keyword} is not a string"
            if not ref.startswith("#"):
                return SCHEMA_NOT_ALLOWED, (
                    f"it refers outside itself ({keyword} {_short(ref)}); a reference may only "
                    "point inside the schema (#...)"
                )
        if "$schema" in node and _specification(node["$schema"]) is None:
            return SCHEMA_NOT_ALLOWED, (
                f"its $schema {_short(node['$schema'])} is not a JSON Schema draft known here "
                "(a meta-schema is never fetched)"
            )
        stack.extend((value, key, depth + 1) for key, value in node.items())
    return None


def _specification(dialect: Any) -> referencing.Specification[Any] | None:
    if not isinstance(dialect, str):
        return None
    try:
        return referencing.jsonschema.specification_with(dialect)
    except referencing.jsonschema.UnknownDialect:
        return None


def _references(schema: dict[str, Any]) -> Refusal | None:
    """Every reference resolved as jsonschema resolves it (an ``$id`` changes the base, as its
    draft says), with a registry that notes what it would have to fetch and fetches nothing;
    then how many schemas the references and the in-place keywords apply to one place of the
    arguments (``MAX_FAN_OUT``)."""
    wanted: list[str] = []

    def note(uri: str) -> referencing.Resource[Any]:
        wanted.append(uri)
        raise _NotRetrieved(uri)

    registry: referencing.Registry[Any] = referencing.Registry(retrieve=note)  # type: ignore[call-arg]
    specification = _specification(schema.get("$schema")) or referencing.jsonschema.DRAFT202012
    root = specification.create_resource(_prepared(schema))
    stack = [(registry.resolver_with_root(root), root)]
    in_place: dict[int, list[int]] = {}  # a schema (by id) -> the schemas it applies in place
    while stack:
        resolver, resource = stack.pop()
        contents = resource.contents
        if isinstance(contents, dict):
            in_place[id(contents)] = kids = _in_place(contents)
        for keyword in REFERENCE_KEYWORDS:
            ref = contents.get(keyword) if isinstance(contents, dict) else None
            if not isinstance(ref, str):
                continue
            try:
                target = resolver.lookup(ref).contents
            except referencing.exceptions.Unresolvable:
                if wanted:
                    return SCHEMA_NOT_ALLOWED, (
                        f"its {keyword} {_short(ref)} points outside the schema "
                        f"({_short(wanted[0])})"
                    )
                return SCHEMA_INVALID, f"its {keyword} {_short(ref)} does not resolve inside it"
            kids.append(id(target))
        stack.extend((resolver.in_subresource(sub), sub) for sub in resource.subresources())
    if _fan_out(in_place) > MAX_FAN_OUT:
        return SCHEMA_NOT_ALLOWED, (
            f"its references and allOf/anyOf/oneOf/not/if apply more than {MAX_FAN_OUT} "
            "schemas to one place of the arguments"
        )
    return None


def _in_place(node: dict[str, Any]) -> list[int]:
    """The schemas ``node`` applies to the same place of the arguments, by id (its references
    are added by the caller, which resolves them)."""
    kids: list[Any] = []
    for keyword in _IN_PLACE_MANY:
        if isinstance(node.get(keyword), list):
            kids.extend(node[keyword])
    kids.extend(node[keyword] for keyword in _IN_PLACE_ONE if keyword in node)
    for keyword in ("dependentSchemas", "dependencies"):
        if isinstance(node.get(keyword), dict):
            kids.extend(v for v in node[keyword].values() if isinstance(v, (dict, bool)))
    return [id(kid) for kid in kids if isinstance(kid, (dict, bool))]


def _fan_out(in_place: dict[int, list[int]]) -> int:
    """The most schemas any one schema applies in place, itself included (a reference loop is
    counted once: the check itself refuses it, ``RecursionError``). Capped past the bound."""
    total: dict[int, int] = {}
    worst = 0
    for start in in_place:
        if start in total:
            continue
        stack: list[tuple[int, int]] = [(start, 0)]
        on_path = {start}
        while stack:
            node, next_kid = stack[-1]
            kids = in_place.get(node, [])
            if next_kid < len(kids):
                stack[-1] = (node, next_kid + 1)
                kid = kids[next_kid]
                if kid not in total and kid not in on_path:
                    on_path.add(kid)
                    stack.append((kid, 0))
                continue
            stack.pop()
            on_path.discard(node)
            total[node] = min(MAX_FAN_OUT + 1, 1 + sum(total.get(kid, 0) for kid in kids))
            worst = max(worst, total[node])
    return worst


def _costs(schema: dict[str, Any]) -> Refusal | None:
    """What each application may cost: every pattern compiles in RE2 within ``RE2_MAX_MEM``
    (compiled here once, as the check compiles it), at most ``MAX_PATTERNS`` of them, and no
    list of names or values longer than ``MAX_NAMES``."""
    patterns: set[str] = set()
    for node in _keyword_nodes(_prepared(schema)):
        for keyword in ("required", "enum", "properties", "dependentRequired"):
            value = node.get(keyword)
            if isinstance(value, (list, dict)) and len(value) > MAX_NAMES:
                return SCHEMA_NOT_ALLOWED, (
                    f"its {keyword} has {len(value)} entries; at most {MAX_NAMES}"
                )
        for keyword in ("dependentRequired", "dependencies"):
            value = node.get(keyword)
            if not isinstance(value, dict):
                continue
            for names in value.values():
                if isinstance(names, list) and len(names) > MAX_NAMES:
                    return SCHEMA_NOT_ALLOWED, (
                        f"its {keyword} lists {len(names)} names for one property; "
                        f"at most {MAX_NAMES}"
                    )
        pattern = node.get("pattern")
        if not isinstance(pattern, str) or pattern in patterns:
            continue
        patterns.add(pattern)
        if len(patterns) > MAX_PATTERNS:
            return SCHEMA_NOT_ALLOWED, f"it has more than {MAX_PATTERNS} patterns"
        if _re2(pattern) is None:
            return SCHEMA_NOT_ALLOWED, (
                f"its pattern {_short(pattern)} is not one RE2 compiles within "
                f"{RE2_MAX_MEM // 1024} KiB (look-around, back-references and very large "
                "patterns are not checked in linear time)"
            )
    return None


def _meta_check(schema: dict[str, Any]) -> Refusal | None:
    """The draft's own meta-schema, applied offline and without ``format`` (a ``pattern`` that
    RE2 reads but Python's ``re`` does not is no reason to refuse a tool)."""
    draft = _draft(schema)
    meta = jsonschema.validators.validator_for(draft.META_SCHEMA, default=draft)
    error = jsonschema.exceptions.best_match(
        meta(draft.META_SCHEMA, registry=OFFLINE).iter_errors(schema)
    )
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path) or "(root)"
    return SCHEMA_INVALID, (
        f"it is not valid JSON Schema at {_short(where, 100)}: {_short(error.message)}"
    )


def _trial(schema: dict[str, Any]) -> Refusal | None:
    try:
        OutsideSchema(schema).errors({})
    except (UnusableSchema, TooCostly) as exc:
        return SCHEMA_INVALID, str(exc)
    return None


def _size(schema: dict[str, Any]) -> Refusal | None:
    size = len(json.dumps(schema, separators=(",", ":"), ensure_ascii=False))
    if size > MAX_SCHEMA_BYTES:
        return SCHEMA_INVALID, f"it is larger than {MAX_SCHEMA_BYTES} bytes"
    return None


def schema_refusal(schema: Any) -> Refusal | None:
    """Why a listed schema is not offered — ``(code, message)`` — or None. Bounded: depth and
    size first, what each keyword may cost (``_costs``: cheap, before the slower checks), then
    the draft's meta-schema, every reference and the fan-out they make, and a trial check of
    ``{}``."""
    if not isinstance(schema, dict):
        return SCHEMA_INVALID, "the input schema is not a JSON object"
    for check in (_walk, _size, _costs, _meta_check, _references, _trial):
        try:
            refusal = check(schema)
        except Exception as exc:  # noqa: BLE001 - a hostile schema's failure becomes a refusal
            refusal = SCHEMA_INVALID, f"it cannot be checked ({type(exc).__name__})"
        if refusal is not None:
            return refusal[0], f"the input schema is refused: {refusal[1]}"
    return None


def cached_refusal(schema: Any) -> Refusal | None:
    """``schema_refusal``, remembered by the schema's text: recorded tools are read again
    whenever a task's tool list is checked or a run starts."""
    try:
        text = json.dumps(schema, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError):
        return SCHEMA_INVALID, "the input schema is refused: it is not JSON"
    return _refusal_of_text(text)


@functools.lru_cache(maxsize=1024)
def _refusal_of_text(text: str) -> Refusal | None:
    return schema_refusal(json.loads(text))
