"""JSON Schema → the TypeScript-like tool signatures of Harmony, quirk for quirk with the reference."""

from __future__ import annotations

from typing import Any

from .serde_json import display


def rust_lines(text: str) -> list[str]:
    """Rust's `str::lines()`: split on `\\n`, drop one `\\r` before it, no empty last line."""
    if "\n" not in text:
        return [text] if text else []
    parts = text.split("\n")
    ended = parts[-1] == ""
    if ended:
        parts.pop()
    last = len(parts) - 1
    return [p[:-1] if p.endswith("\r") and (i < last or ended) else p for i, p in enumerate(parts)]


def _default_text(default: Any, schema: dict[str, Any]) -> str:
    """`default: …` for properties: strings raw (quoted unless the schema has an enum)."""
    if isinstance(default, str):
        enum = schema.get("enum")
        if isinstance(enum, list) and enum:
            return f"default: {default}"
        return f'default: "{default}"'
    return f"default: {display(default)}"


def _variant_default_text(default: Any, schema: dict[str, Any]) -> str:
    """`default: …` inside a nested oneOf: like properties, except that an enum's string is JSON."""
    if isinstance(default, str) and not (isinstance(schema.get("enum"), list) and schema["enum"]):
        return f'default: "{default}"'
    return f"default: {display(default)}"


def _with_nullable(schema: Any, rendered: str) -> str:
    if isinstance(schema, dict) and schema.get("nullable") is True and "null" not in rendered:
        return rendered + " | null"
    return rendered


def _nested_one_of(variants: list[Any], indent: str) -> str:
    out = []
    for variant in variants:
        out.append(f"\n{indent} | " + _with_nullable(variant, to_typescript(variant, indent + "   ")))
        if isinstance(variant, dict):
            notes = []
            if isinstance(variant.get("description"), str):
                notes.append(variant["description"])
            if "default" in variant:
                notes.append(_variant_default_text(variant["default"], variant))
            if notes:
                out.append(" // " + " ".join(notes))
    return "".join(out)


def _property_one_of(key: str, optional: str, prop: dict[str, Any], indent: str) -> str:
    variants = prop["oneOf"]
    description = prop.get("description") if isinstance(prop.get("description"), str) else None
    first = variants[0] if variants else None
    skip = description is not None and isinstance(first, dict) and first.get("description") == description
    out = []
    above = False
    if not skip and description is not None:
        out.append(f"{indent}// {description}\n")
        above = True
    if "default" in prop:
        out.append(f"{indent}// {_default_text(prop['default'], prop)}\n")
    out.append(f"{indent}{key}{optional}:\n")
    for i, variant in enumerate(variants):
        out.append(f"{indent} | " + _with_nullable(variant, to_typescript(variant, indent + "   ")))
        notes = []
        if isinstance(variant, dict):
            variant_description = variant.get("description")
            if not (i == 0 and above) and isinstance(variant_description, str) and variant_description != description:
                notes.append(variant_description)
            if "default" in variant:
                notes.append(_default_text(variant["default"], variant))
        if notes:
            out.append(" // " + " ".join(notes))
        out.append("\n")
    out.append(f"{indent},\n")
    return "".join(out)


_LEAF_TYPES = {"string": "string", "number": "number", "integer": "number", "boolean": "boolean"}
# The keys that add comments or variants to a property; a property without them takes the short path.
_DECORATIONS = frozenset({"title", "examples", "oneOf", "nullable"})


def _string_type(enum: Any) -> str:
    """A string's type: the union of its enum's string values, if it has any."""
    if isinstance(enum, list):
        values = [f'"{v}"' for v in enum if isinstance(v, str)]
        if values:
            return " | ".join(values)
    return "string"


def _leaf(prop: dict[str, Any]) -> str | None:
    """The type of a string, number or boolean property without the keys that change it; None
    otherwise (the general conversion then applies)."""
    if "oneOf" in prop:
        return None
    kind = prop.get("type")
    if kind == "string":
        return _string_type(prop.get("enum"))
    return _LEAF_TYPES.get(kind) if isinstance(kind, str) else None


def _object(schema: dict[str, Any], indent: str) -> str:
    description = schema.get("description")
    out = [f"{indent}// {description}\n{{\n" if isinstance(description, str) else "{\n"]
    properties = schema.get("properties")
    required = schema.get("required")
    if not isinstance(required, list):
        required = ()  # membership of a str key: the list's other items never match, as if filtered out
    if isinstance(properties, dict):
        inner = indent + "    "
        for key, prop in properties.items():
            optional = "" if key in required else "?"
            if not isinstance(prop, dict):
                out.append(f"{indent}{key}{optional}: any,\n")
                continue
            if prop.keys().isdisjoint(_DECORATIONS):  # the common case, in fewer steps
                rendered = _leaf(prop) or to_typescript(prop, inner)
                prop_description = prop.get("description")
                if isinstance(prop_description, str):
                    out.append(f"{indent}// {prop_description}\n")
                if "default" in prop:
                    out.append(f"{indent}{key}{optional}: {rendered}, // {_default_text(prop['default'], prop)}\n")
                else:
                    out.append(f"{indent}{key}{optional}: {rendered},\n")
                continue
            has_one_of = "oneOf" in prop
            title = prop.get("title")
            if isinstance(title, str):
                out.append(f"{indent}// {title}\n{indent}//\n")
            prop_description = prop.get("description")
            if not has_one_of and isinstance(prop_description, str):
                out.append(f"{indent}// {prop_description}\n")
            examples = prop.get("examples")
            if isinstance(examples, list) and examples:
                out.append(f"{indent}// Examples:\n")
                out.extend(f'{indent}// - "{ex}"\n' for ex in examples if isinstance(ex, str))
            if has_one_of and isinstance(prop["oneOf"], list):
                out.append(_property_one_of(key, optional, prop, indent))
                continue
            leaf = _leaf(prop)
            rendered = _with_nullable(prop, leaf if leaf is not None else to_typescript(prop, inner))
            if not has_one_of and "default" in prop:
                out.append(f"{indent}{key}{optional}: {rendered}, // {_default_text(prop['default'], prop)}\n")
            else:
                out.append(f"{indent}{key}{optional}: {rendered},\n")
    out.append(f"{indent}}}")
    return "".join(out)


def to_typescript(schema: Any, indent: str = "") -> str:
    """Render one JSON Schema value as a Harmony TypeScript type."""
    if not isinstance(schema, dict):
        return "any"
    if "oneOf" in schema and isinstance(schema["oneOf"], list):
        return _nested_one_of(schema["oneOf"], indent)
    kind = schema.get("type")  # compared with strings first: a list or other value equals none of them
    if kind == "object":
        return _object(schema, indent)
    if kind == "string":
        return _string_type(schema.get("enum"))
    if kind == "array":
        return to_typescript(schema["items"], indent) + "[]" if "items" in schema else "Array<any>"
    if kind == "number" or kind == "integer":
        return "number"
    if kind == "boolean":
        return "boolean"
    if isinstance(kind, list):
        names = ["number" if k == "integer" else k for k in kind if isinstance(k, str)]
        if names:
            return " | ".join(names)
    return "any"
