"""JSON Schema → the TypeScript-like tool signatures of Harmony, quirk for quirk with the reference."""

from __future__ import annotations

from typing import Any

from .serde_json import display


def rust_lines(text: str) -> list[str]:
    """Rust's `str::lines()`: split on `\\n`, drop one `\\r` before it, no empty last line."""
    if not text:
        return []
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


def _object(schema: dict[str, Any], indent: str) -> str:
    out = []
    if isinstance(schema.get("description"), str):
        out.append(f"{indent}// {schema['description']}\n")
    out.append("{\n")
    properties = schema.get("properties")
    required_list = schema.get("required")
    required = {r for r in required_list if isinstance(r, str)} if isinstance(required_list, list) else set()
    if isinstance(properties, dict):
        for key, prop in properties.items():
            optional = "" if key in required else "?"
            if not isinstance(prop, dict):
                out.append(f"{indent}{key}{optional}: any,\n")
                continue
            has_one_of = "oneOf" in prop
            if isinstance(prop.get("title"), str):
                out.append(f"{indent}// {prop['title']}\n{indent}//\n")
            if not has_one_of and isinstance(prop.get("description"), str):
                out.append(f"{indent}// {prop['description']}\n")
            examples = prop.get("examples")
            if isinstance(examples, list) and examples:
                out.append(f"{indent}// Examples:\n")
                out.extend(f'{indent}// - "{ex}"\n' for ex in examples if isinstance(ex, str))
            if isinstance(prop.get("oneOf"), list):
                out.append(_property_one_of(key, optional, prop, indent))
                continue
            rendered = _with_nullable(prop, to_typescript(prop, indent + "    "))
            out.append(f"{indent}{key}{optional}: {rendered},")
            if not has_one_of and "default" in prop:
                out.append(" // " + _default_text(prop["default"], prop))
            out.append("\n")
    out.append(f"{indent}}}")
    return "".join(out)


def to_typescript(schema: Any, indent: str = "") -> str:
    """Render one JSON Schema value as a Harmony TypeScript type."""
    if not isinstance(schema, dict):
        return "any"
    one_of = schema.get("oneOf")
    if isinstance(one_of, list):
        return _nested_one_of(one_of, indent)
    kind = schema.get("type")
    if isinstance(kind, list):
        names = ["number" if k == "integer" else k for k in kind if isinstance(k, str)]
        if names:
            return " | ".join(names)
    if not isinstance(kind, str):
        return "any"
    if kind == "object":
        return _object(schema, indent)
    if kind == "string":
        enum = schema.get("enum")
        if isinstance(enum, list):
            values = [v for v in enum if isinstance(v, str)]
            if values:
                return " | ".join(f'"{v}"' for v in values)
        return "string"
    if kind in ("number", "integer"):
        return "number"
    if kind == "boolean":
        return "boolean"
    if kind == "array":
        if "items" in schema:
            return to_typescript(schema["items"], indent) + "[]"
        return "Array<any>"
    return "any"
