"""JSON Schema → TypeScript: each quirk of the reference (notes §1.7), checked token-exact."""

from __future__ import annotations

import pytest
from reference import reference_render

from harmony import CotPolicy, DeveloperContent, Message, Role, ToolDescription
from harmony.schema_ts import to_typescript


def obj(properties, required=None, **extra):
    schema = {"type": "object", "properties": properties, **extra}
    if required is not None:
        schema["required"] = required
    return schema


SCHEMAS = {
    "type_list": {"type": ["integer", "string", 3, "null"]},
    "type_list_no_strings_falls_to_any": {"type": [1, 2]},
    "object_or_null_ignores_properties": {"type": ["object", "null"], "properties": {"a": {"type": "string"}}},
    "string_enum_raw_quotes": obj({"s": {"type": "string", "enum": ['d"e', "x", 3, None]}}),
    "string_enum_without_strings": obj({"s": {"type": "string", "enum": [1, 2]}}),
    "integer_enum_is_number": obj({"n": {"type": "integer", "enum": [1, 2, 3]}}),
    "array_of_enum_no_parens": obj({"a": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}}}),
    "array_of_nullable": obj({"a": {"type": "array", "items": {"type": ["string", "null"]}}}),
    "array_without_items": obj({"a": {"type": "array"}}),
    "array_null_items": obj({"a": {"type": "array", "items": None}}),
    "unknown_types_any": obj({"a": {"type": "null"}, "b": {"type": "date"}}),
    "anyof_allof_ref_const_enum_without_type": obj(
        {
            "a": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "b": {"allOf": [{"type": "string"}]},
            "c": {"$ref": "#/$defs/x"},
            "d": {"const": 1},
            "e": {"enum": ["x", "y"]},
        },
        **{"$defs": {"x": {"type": "string"}}},
    ),
    "ignored_keywords": obj(
        {"a": {"type": "string", "format": "email", "pattern": "^a", "minLength": 1}},
        additionalProperties=False,
        title="T",
        examples=[{}],
    ),
    "nullable_only_when_true": obj(
        {
            "a": {"type": "string", "nullable": True},
            "b": {"type": "string", "nullable": "true"},
            "c": {"type": ["string", "null"], "nullable": True},
        }
    ),
    "nested_object_description_twice": obj(
        {"inner": {"type": "object", "description": "Inner thing", "properties": {"x": {"type": "number"}}}},
        required=["inner"],
    ),
    "title_and_examples": obj(
        {"q": {"type": "string", "title": "Query", "description": "what", "examples": ["a", 1, "b"]}}
    ),
    "raw_property_names": obj({"kebab-case": {"type": "string"}, "with space": {"type": "string"}, "": {}, "123": {}}),
    "required_not_in_properties": obj({"a": {"type": "string"}}, required=["a", "zzz", 5]),
    "descriptions_with_newlines": obj(
        {"a": {"type": "string", "description": "line1\nline2"}}, description="top\ndesc"
    ),
    "defaults_strings_raw_and_enum_unquoted": obj(
        {
            "s": {"type": "string", "default": 'he said "hi" \\ back'},
            "e": {"type": "string", "enum": ["c", "f"], "default": "c"},
        }
    ),
    "defaults_json_values": obj(
        {
            "b": {"type": "boolean", "default": True},
            "n": {"type": "string", "default": None},
            "l": {"type": "array", "default": [1, 2, 3]},
            "o": {"type": "object", "default": {"k": "v", "n": [1, {"z": None}], "u": 'ü"\n'}},
        }
    ),
    "defaults_floats_like_ryu": obj(
        {
            f"f{i}": {"type": "number", "default": v}
            for i, v in enumerate(
                [1.0, 2.5, 1e20, 1e-7, 1e16, 1e15, 1000000000000000.0, 0.0001, -0.0, 1e-5, 0.1, 123456789.0, 5e-324]
            )
        }
    ),
    "defaults_17_digit_float_one_ulp_off": obj({"f": {"type": "number", "default": 953796.9242777601}}),
    "defaults_huge_integers": obj(
        {
            "u": {"type": "integer", "default": 2**64},
            "v": {"type": "integer", "default": 2**64 - 1},
            "w": {"type": "integer", "default": -(2**63)},
            "x": {"type": "integer", "default": -(2**63) - 1},
            "y": {"type": "integer", "default": 10**30},
        }
    ),
    "property_one_of_with_defaults": obj(
        {
            "oneof_string_or_number": {
                "oneOf": [
                    {"type": "string", "default": "x"},
                    {"type": "number", "description": "numbers can happen too"},
                ],
                "description": "either",
                "default": "d",
            }
        }
    ),
    "property_one_of_first_variant_same_description": obj(
        {
            "p": {
                "description": "same",
                "oneOf": [{"type": "string", "description": "same"}, {"type": "number", "description": "same"}],
            }
        },
        required=["p"],
    ),
    "property_one_of_nullable_and_enum_default": obj(
        {
            "p": {
                "oneOf": [
                    {"type": "string", "enum": ["a", "b"], "default": "a", "nullable": True},
                    {"type": "object", "properties": {"z": {"type": "boolean"}}},
                ],
                "title": "Title",
                "examples": ["e"],
            }
        }
    ),
    "property_one_of_not_a_list": obj({"p": {"type": "string", "oneOf": "nope", "description": "d", "default": "x"}}),
    "top_level_one_of": {
        "oneOf": [
            {"type": "object", "properties": {"a": {"type": "string"}}, "description": "first"},
            {"type": "object", "properties": {"b": {"type": "number"}}, "nullable": True, "default": {"b": 1}},
        ]
    },
    "items_one_of": obj(
        {
            "items": {
                "type": "array",
                "items": {
                    "oneOf": [
                        {"type": "string", "description": "name"},
                        {"type": "number", "default": 0},
                        {"type": "string", "enum": ["x"], "default": "x"},
                    ]
                },
            }
        }
    ),
    "deeply_nested": obj(
        {
            "a": obj(
                {"b": obj({"c": {"type": "array", "items": obj({"d": {"type": "string", "description": "deep"}})}})},
                description="level a",
            )
        },
        required=["a"],
    ),
    "properties_not_a_dict": {"type": "object", "properties": [1, 2]},
    "property_not_a_dict": obj({"a": 5, "b": "string"}),
}


def _messages(schema):
    developer = DeveloperContent().with_function_tools([ToolDescription("f", "Tool.", schema)])
    return [Message.of(Role.DEVELOPER, developer), Message.of(Role.USER, "go")]


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_schema_matches_reference(renderer, name):
    messages = _messages(SCHEMAS[name])
    assert renderer.render_for_completion(messages) == reference_render(messages, "completion", CotPolicy.REFERENCE)


def test_quirks_as_text():
    nested = SCHEMAS["nested_object_description_twice"]
    assert to_typescript(nested) == ("{\n// Inner thing\ninner:     // Inner thing\n{\n    x?: number,\n    },\n}")
    assert to_typescript(SCHEMAS["array_of_enum_no_parens"]) == '{\na?: "a" | "b"[],\n}'
    assert to_typescript({"type": "integer", "enum": [1, 2, 3]}) == "number"
    assert to_typescript({"anyOf": [{"type": "string"}, {"type": "null"}]}) == "any"
    assert "// default: 953796.92427776" in to_typescript(SCHEMAS["defaults_17_digit_float_one_ulp_off"])
    assert "f2?: number, // default: 1e20" in to_typescript(SCHEMAS["defaults_floats_like_ryu"])
    assert to_typescript(SCHEMAS["top_level_one_of"]).startswith("\n |    // first\n{\n   a?: string,\n   } // first")
    assert to_typescript([1, 2]) == "any"
