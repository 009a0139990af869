"""A JSON Schema written by someone else (an MCP server's input schema), applied offline.

jsonschema, left to itself, resolves a ``$ref`` it cannot find inside the schema by fetching
it (``urlopen``: ``http://``, ``file:///``) — while the worker checks a model's arguments, before
any person approved the call, with the fetched document echoed in the refusal. Here every
reference resolves only inside the schema: a ``referencing`` registry whose retrieval always
fails, handed to every validator (never the deprecated ``RefResolver``).

Two doors, one set of rules:

* ``schema_refusal(schema)`` — when a server is tested or its recorded tools are read: a schema
  that reaches outside itself is ``schema_not_allowed``; one that is not valid JSON Schema, too
  large or too deep, or that cannot be applied even to ``{}`` is ``schema_invalid``. Its tool is
  not offered.
* ``OutsideSchema.errors(arguments)`` — every argument check: the validation errors, or
  ``UnusableSchema`` when the schema itself cannot be applied (a loop of references, an unknown
  type, a reference to nowhere, too much work). It never raises anything else.

Patterns run through RE2 (linear time); one RE2 cannot compile (look-around, back-references)
is not enforced, and neither is ``patternProperties`` (with the ``additionalProperties`` beside
it): the server still checks its own input.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import jsonschema
import re2
import referencing
import referencing.exceptions
import referencing.jsonschema

SCHEMA_NOT_ALLOWED = "schema_not_allowed"  # it refers to something outside itself
SCHEMA_INVALID = "schema_invalid"  # not valid JSON Schema, too large, or cannot be applied

#: A schema larger than this (as compact JSON) or nested deeper is refused when it is listed.
MAX_SCHEMA_BYTES = 256 * 1024
MAX_SCHEMA_DEPTH = 64
#: Keyword applications one argument check may make: references that fan out
#: (``allOf: [a, a]`` thirty levels deep) would otherwise take the worker's thread for ever.
MAX_CHECK_STEPS = 200_000

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


def _re2(pattern: str) -> Any:  # a compiled RE2 pattern (re2 has no type hints), or None
    try:
        return re2.compile(pattern, options=_RE2_OPTIONS)
    except (re2.error, TypeError, ValueError):
        return None


def _re2_pattern(
    validator: jsonschema.protocols.Validator, pattern: Any, instance: Any, schema: dict[str, Any]
) -> Iterator[jsonschema.ValidationError]:
    """The ``pattern`` keyword: ``pattern`` and ``instance`` are whatever JSON the schema and the
    arguments hold."""
    if not isinstance(pattern, str) or not validator.is_type(instance, "string"):
        return
    compiled = _re2(pattern)
    if compiled is not None and compiled.search(instance) is None:
        yield jsonschema.ValidationError(f"{instance[:100]!r} does not match {pattern[:200]!r}")


# -- the work bound -----------------------------------------------------------------------------


class _TooMuchWork(Exception):
    pass


_steps = threading.local()

type _Keyword = Callable[..., Any]


def _counted(keyword: _Keyword) -> _Keyword:
    """A keyword function that spends one step of the running check (``OutsideSchema.errors``)."""

    @functools.wraps(keyword)
    def counted(*args: Any) -> Any:
        left = getattr(_steps, "left", 0) - 1
        if left < 0:
            raise _TooMuchWork
        _steps.left = left
        return keyword(*args)

    return counted


@functools.cache
def _validator_class(base: type[jsonschema.protocols.Validator]) -> Any:
    """``base`` with RE2 patterns and every keyword counted (one class per draft)."""
    keywords = {name: _counted(fn) for name, fn in base.VALIDATORS.items()}
    keywords["pattern"] = _counted(_re2_pattern)
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


def _draft(schema: dict[str, Any]) -> type[jsonschema.protocols.Validator]:
    draft: type[jsonschema.protocols.Validator] = jsonschema.validators.validator_for(
        schema, default=jsonschema.Draft202012Validator
    )
    return draft


class OutsideSchema:
    """A schema from outside, checked offline (``OFFLINE``), with RE2 and a work bound."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self.schema = schema
        self._validator: jsonschema.protocols.Validator | None = None

    def _build(self) -> jsonschema.protocols.Validator:
        if self._validator is None:
            cls = _validator_class(_draft(self.schema))
            self._validator = cls(_prepared(self.schema), registry=OFFLINE)
        return self._validator

    def errors(self, instance: Any) -> list[jsonschema.ValidationError]:
        """The ways ``instance`` breaks the schema, in path order. ``UnusableSchema`` when the
        schema cannot be applied; nothing else escapes (the schema is the server's, hostile)."""
        _steps.left = MAX_CHECK_STEPS
        try:
            found = list(self._build().iter_errors(instance))
        except _TooMuchWork:
            raise UnusableSchema(
                f"checking the arguments against it took more than {MAX_CHECK_STEPS} steps"
            ) from None
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
            _steps.left = 0
        return sorted(found, key=lambda e: [_sortable(p) for p in e.path])


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
    draft says), with a registry that notes what it would have to fetch and fetches nothing."""
    wanted: list[str] = []

    def note(uri: str) -> referencing.Resource[Any]:
        wanted.append(uri)
        raise _NotRetrieved(uri)

    registry: referencing.Registry[Any] = referencing.Registry(retrieve=note)  # type: ignore[call-arg]
    specification = _specification(schema.get("$schema")) or referencing.jsonschema.DRAFT202012
    root = specification.create_resource(_prepared(schema))
    stack = [(registry.resolver_with_root(root), root)]
    while stack:
        resolver, resource = stack.pop()
        contents = resource.contents
        for keyword in REFERENCE_KEYWORDS:
            ref = contents.get(keyword) if isinstance(contents, dict) else None
            if not isinstance(ref, str):
                continue
            try:
                resolver.lookup(ref)
            except referencing.exceptions.Unresolvable:
                if wanted:
                    return SCHEMA_NOT_ALLOWED, (
                        f"its {keyword} {_short(ref)} points outside the schema "
                        f"({_short(wanted[0])})"
                    )
                return SCHEMA_INVALID, f"its {keyword} {_short(ref)} does not resolve inside it"
        stack.extend((resolver.in_subresource(sub), sub) for sub in resource.subresources())
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
    except UnusableSchema as exc:
        return SCHEMA_INVALID, str(exc)
    return None


def _size(schema: dict[str, Any]) -> Refusal | None:
    size = len(json.dumps(schema, separators=(",", ":"), ensure_ascii=False))
    if size > MAX_SCHEMA_BYTES:
        return SCHEMA_INVALID, f"it is larger than {MAX_SCHEMA_BYTES} bytes"
    return None


def schema_refusal(schema: Any) -> Refusal | None:
    """Why a listed schema is not offered — ``(code, message)`` — or None. Bounded: depth and
    size first, then the draft's meta-schema, every reference, and a trial check of ``{}``."""
    if not isinstance(schema, dict):
        return SCHEMA_INVALID, "the input schema is not a JSON object"
    for check in (_walk, _size, _meta_check, _references, _trial):
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
