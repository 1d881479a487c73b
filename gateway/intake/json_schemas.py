"""JSON Schemas from clients, made safe to check values against: nothing fetched, nothing unbounded.

A schema (a text format's or a tool's parameters) is accepted when:
- it is at most MAX_SCHEMA_CHARS of JSON, nests at most MAX_DEPTH levels, has at most MAX_NODES objects and
  arrays, MAX_PROPERTIES properties in all (OpenAI's limit for structured outputs) and patterns of at most
  MAX_PATTERN_CHARS: each checked in one linear walk before anything costlier, and named in the 400;
- every `$ref` / `$dynamicRef` is a `#` JSON pointer that resolves inside the schema itself: nothing is
  ever retrieved (a `http://` or `file://` reference is a 400, and the registry retrieves nothing);
- no reference cycle stays on the same value (`{"$ref": "#"}` would recurse forever; a cycle through
  `properties` or `items` descends into the value, which is finite, and is fine);
- each `pattern` and `patternProperties` key compiles under RE2, which matches in linear time (so
  `^(a+)+$` costs microseconds, not seconds); lookaround and backreferences are refused by name;
- it passes the 2020-12 metaschema (checked by jsonschema-rs, in Rust: the Python check took seconds on a
  large schema; its $schema is data there, never a document to retrieve).
The accepted validator is cached by the schema's canonical text: a schema that agents send every turn is
checked once per process, and values are validated with the same validator.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from typing import Any

import jsonschema_rs
import re2
from jsonschema import Draft202012Validator, ValidationError, validators
from referencing import Registry
from referencing.exceptions import NoSuchResource, Unresolvable

from ..errors import invalid

MAX_SCHEMA_CHARS = 512 * 1024
MAX_DEPTH = 48
MAX_NODES = 20_000
MAX_PROPERTIES = 5_000
MAX_PATTERN_CHARS = 1_000
IN_PLACE = ("allOf", "anyOf", "oneOf", "not", "if", "then", "else", "$ref", "$dynamicRef", "dependentSchemas")
_REF_KEYS = ("$ref", "$dynamicRef")


class SchemaRefused(ValueError):
    """Why a schema is refused; `where` is the JSON pointer of the offending part."""

    def __init__(self, message: str, where: str) -> None:
        super().__init__(message)
        self.where = where


@functools.lru_cache(maxsize=4096)
def _regex(pattern: str) -> Any:
    return re2.compile(pattern)


def _search(pattern: str, text: str) -> bool:
    return _regex(pattern).search(text) is not None


def _pattern(validator: Any, pattern: str, instance: Any, schema: dict[str, Any]) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not _search(pattern, instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(validator: Any, patterns: dict[str, Any], instance: Any, schema: dict[str, Any]):
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if _search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(validator: Any, extra_schema: Any, instance: Any, schema: dict[str, Any]):
    if not validator.is_type(instance, "object"):
        return
    named = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extras = sorted(
        (key for key in instance if key not in named and not any(_search(p, key) for p in patterns)), key=str
    )
    if validator.is_type(extra_schema, "object"):
        for key in extras:
            yield from validator.descend(instance[key], extra_schema, path=key)
    elif extra_schema is False and extras:
        yield ValidationError(f"Additional properties are not allowed ({', '.join(map(repr, extras))} unexpected)")


SafeValidator = validators.extend(
    Draft202012Validator,
    {"pattern": _pattern, "patternProperties": _pattern_properties, "additionalProperties": _additional_properties},
)


def _retrieve_nothing(uri: str) -> Any:
    raise NoSuchResource(ref=uri)


_REGISTRY: Registry = Registry(retrieve=_retrieve_nothing)


def _pointer(path: tuple[str | int, ...]) -> str:
    return "#" + "".join("/" + str(part).replace("~", "~0").replace("/", "~1") for part in path)


def _walk(schema: Any) -> Iterator[tuple[Any, tuple[str | int, ...]]]:
    """Every object and array in the schema with its path, refusing depth and size past the bounds."""
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(schema, ())]
    nodes = properties = 0
    while stack:
        node, path = stack.pop()
        if not isinstance(node, dict | list):
            continue
        nodes += 1
        if nodes > MAX_NODES:
            raise SchemaRefused(f"the schema has more than {MAX_NODES} objects and arrays (the limit)", "#")
        if len(path) > MAX_DEPTH:
            raise SchemaRefused(f"the schema nests deeper than {MAX_DEPTH} levels (the limit)", _pointer(path))
        if isinstance(node, dict) and isinstance(node.get("properties"), dict):
            properties += len(node["properties"])
            if properties > MAX_PROPERTIES:
                message = f"the schema has more than {MAX_PROPERTIES} properties in all (the limit)"
                raise SchemaRefused(message, _pointer((*path, "properties")))
        yield node, path
        children = node.items() if isinstance(node, dict) else enumerate(node)
        stack.extend((child, (*path, key)) for key, child in children)


def _resolve(schema: Any, ref: str, where: str) -> tuple[Any, str]:
    """The subschema a local `#` / `#/...` reference names, and its pointer."""
    if ref != "#" and not ref.startswith("#/"):
        raise SchemaRefused(f"'{ref}' is not a JSON pointer inside the schema ('#/...'); nothing is fetched", where)
    target = schema
    for raw in ref[2:].split("/") if ref != "#" else []:
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(target, dict) and part in target:
            target = target[part]
        elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
            target = target[int(part)]
        else:
            raise SchemaRefused(f"'{ref}' does not resolve inside the schema", where)
    return target, ref


def _in_place(node: Any) -> Iterator[tuple[str, Any]]:
    """The subschemas and references that apply to the same value as `node` (not properties or items)."""
    if not isinstance(node, dict):
        return
    for key in IN_PLACE:
        value = node.get(key)
        if key in _REF_KEYS:
            if isinstance(value, str):
                yield key, value
        elif isinstance(value, list):
            yield from ((key, item) for item in value)
        elif isinstance(value, dict):
            yield from ((key, item) for item in value.values()) if key == "dependentSchemas" else [(key, value)]


def _refs_in_place(node: Any) -> Iterator[str]:
    """The references reached from `node` without leaving the value it applies to."""
    stack = [node]
    while stack:
        for key, sub in _in_place(stack.pop()):
            if key in _REF_KEYS:
                yield sub
            else:
                stack.append(sub)


def _check_cycles(schema: Any, sources: list[str]) -> None:
    """Refuse references that lead back to a schema applying to the same value (an endless loop)."""

    def targets(pointer: str) -> Iterator[str]:
        node, _ = _resolve(schema, pointer, pointer)
        return (_resolve(schema, ref, pointer)[1] for ref in _refs_in_place(node))

    done: set[str] = set()
    for start in sources:
        if start in done:
            continue
        path = [(start, targets(start))]
        on_path = {start}
        while path:
            pointer, pending = path[-1]
            following = next(pending, None)
            if following is None:
                path.pop()
                on_path.discard(pointer)
                done.add(pointer)
            elif following in on_path:
                raise SchemaRefused(f"'{following}' refers back to itself without descending into the value", pointer)
            elif following not in done:
                on_path.add(following)
                path.append((following, targets(following)))


def _inspect(schema: Any) -> None:
    sources: list[str] = []
    for node, path in _walk(schema):
        if not isinstance(node, dict):
            continue
        where = _pointer(path)
        if path and "$id" in node:
            raise SchemaRefused("'$id' is allowed only at the root", where)
        for key in _REF_KEYS:
            if isinstance(node.get(key), str):
                _resolve(schema, node[key], where)
                sources.append(where)
        patterns = []
        if isinstance(node.get("pattern"), str):
            patterns.append(node["pattern"])
        if isinstance(node.get("patternProperties"), dict):
            patterns.extend(node["patternProperties"])
        for pattern in patterns:
            if len(pattern) > MAX_PATTERN_CHARS:
                raise SchemaRefused(f"a pattern is longer than {MAX_PATTERN_CHARS} characters (the limit)", where)
            try:
                _regex(pattern)
            except re2.error:
                raise SchemaRefused(
                    f"the pattern {pattern!r} needs a regex feature this gateway does not run in linear time "
                    "(lookaround or backreferences)",
                    where,
                ) from None
    _check_cycles(schema, sources)


def _retrieve_never(uri: str) -> Any:
    raise SchemaRefused(f"'{uri}' would have to be retrieved; nothing is fetched", "#")


_METASCHEMA = jsonschema_rs.Draft202012Validator(Draft202012Validator.META_SCHEMA, retriever=_retrieve_never)


@functools.lru_cache(maxsize=1024)
def _accepted(canonical: str) -> Any:
    """The validator for a schema (by its canonical text), or SchemaRefused / jsonschema_rs.ValidationError."""
    schema = json.loads(canonical)
    _inspect(schema)
    _METASCHEMA.validate(schema)
    return SafeValidator(schema, registry=_REGISTRY)


def schema_text(schema: dict[str, Any]) -> str:
    """A schema as compact JSON in its own key order: made once per request, it sizes the schema for the
    tenant's caps and keys the validator and render caches."""
    return json.dumps(schema, separators=(",", ":"))


def validator_for(schema: dict[str, Any], param: str, text: str | None = None) -> Any:
    """The checked schema's validator (`text`: its schema_text, when the caller has it), or a 400 naming
    `param` and where in the schema the problem is."""
    text = text if text is not None else schema_text(schema)
    if len(text) > MAX_SCHEMA_CHARS:
        message = f"Invalid JSON Schema: it is {len(text)} characters of JSON, past the limit of {MAX_SCHEMA_CHARS}."
        raise invalid(param, message)
    try:
        return _accepted(text)
    except SchemaRefused as exc:
        raise invalid(param, f"Invalid JSON Schema at {exc.where}: {exc}.") from None
    except jsonschema_rs.ValidationError as exc:
        where = _pointer(tuple(exc.instance_path))
        raise invalid(param, f"Invalid JSON Schema at {where}: {exc.message}") from None


def first_error(schema: dict[str, Any], value: Any) -> ValidationError | None:
    """The first way `value` breaks an accepted schema (None when it matches)."""
    validator = validator_for(schema, "schema")
    try:
        return next(iter(validator.iter_errors(value)), None)
    except (Unresolvable, RecursionError) as exc:  # cannot happen for an accepted schema; never a 500
        return ValidationError(f"the schema could not be applied ({type(exc).__name__})")
