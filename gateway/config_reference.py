"""The configuration reference (docs/configuration.md), generated from the settings models' own descriptions.

    python -m gateway.config_reference [--write docs/configuration.md]

Every `GATEWAY_*` variable, every per-tenant limit (GATEWAY_LIMITS), the engine server's `GATEWAY_ENGINE_*`
variables and the backends' options, each with its type, default and meaning (the attribute docstrings beside each
field, kept by pydantic's `use_attribute_docstrings`). tests/gateway/test_config_reference.py fails when a field
has no description or the committed page is not what this renders.
"""

from __future__ import annotations

import argparse
import json
import re
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from backends.engine.backend import EngineOptions
from backends.remote import RemoteOptions

from .config import BackendConfig, EngineServerSettings, Settings
from .tenants.limits import TenantLimits

PAGE = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
SECTIONS: tuple[tuple[str, type[BaseModel], str, str], ...] = (
    (
        "The gateway (`gpt-oss-gateway serve`)",
        Settings,
        "GATEWAY_",
        "Environment variables; lists take commas, objects take JSON.",
    ),
    (
        "Per-tenant limits (`GATEWAY_LIMITS`)",
        TenantLimits,
        "",
        'JSON: `{"default": {...}, "tenants": {"name": {...}}}`, each object with these fields; a tenant\'s own '
        "object overrides the default field by field.",
    ),
    (
        "A backend entry (`GATEWAY_BACKENDS`)",
        BackendConfig,
        "",
        'JSON: `{"name": {"kind": ..., "options": {...}, "models": [...]}}`.',
    ),
    (
        "The built-in engine's options (kinds `onnx` and, on an engine server, its `GATEWAY_ENGINE_OPTIONS`)",
        EngineOptions,
        "",
        "The `options` of an `onnx` backend; [backends](backends.md) says more of each.",
    ),
    (
        "Remote token servers' options (kinds `vllm`, `sglang`, `sglang_generate`, `llamacpp`, `engine`)",
        RemoteOptions,
        "",
        "The `options` of a remote backend; [backends](backends.md) says more of each.",
    ),
    (
        "The engine server (`gpt-oss-gateway serve-engine`)",
        EngineServerSettings,
        "GATEWAY_ENGINE_",
        "Environment variables of the built-in engine served alone, for API replicas' `engine` backends.",
    ),
)


def _type_name(annotation: Any) -> str:
    """The field's type as a reader knows it: int, list[str], one of `a`, `b`, ..."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) is typing.Literal:
        return "one of " + ", ".join(f"`{value}`" for value in typing.get_args(annotation))
    args = typing.get_args(annotation)
    if type(None) in args:
        rest = [arg for arg in args if arg is not type(None)]
        return " or ".join(_type_name(arg) for arg in rest) + " or null"
    if isinstance(annotation, type) and not args:
        return {"SecretStr": "string (secret)"}.get(annotation.__name__, annotation.__name__)
    text = str(annotation).replace("typing.", "")
    return re.sub(r"\b(?:[a-z_]+\.)+(?=[A-Z])", "", text)  # module paths off class names


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if isinstance(value, BaseModel):  # an object of its own: its fields have their own defaults
        return "below" if type(value).__name__ == "LimitsConfig" else "[hosted tools](hosted-tools.md)"
    try:
        return f"`{json.dumps(value)}`"
    except TypeError:
        return f"`{value}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def render() -> str:
    lines = [
        "# Configuration reference",
        "",
        "Generated from the settings models by `python -m gateway.config_reference --write docs/configuration.md`;",
        "a test fails when this page is stale or a setting has no description.",
        "",
    ]
    for title, model, prefix, note in SECTIONS:
        lines += [f"## {title}", "", note, "", "| name | type | default | meaning |", "|---|---|---|---|"]
        for name, field in model.model_fields.items():
            shown = f"{prefix}{name.upper()}" if prefix else name
            lines.append(
                f"| `{shown}` | {_cell(_type_name(field.annotation))} | {_cell(_default(field))} "
                f"| {_cell(field.description or '')} |"
            )
        lines.append("")
    return "\n".join(lines)


def undescribed() -> list[str]:
    """The settings with no description (each must have one)."""
    return [f"{model.__name__}.{name}" for _, model, _, _ in SECTIONS
            for name, field in model.model_fields.items() if not field.description]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", type=Path, help=f"write the page here (the docs' page: {PAGE.name})")
    args = parser.parse_args()
    page = render()
    if args.write:
        args.write.write_text(page)
    else:
        print(page)


if __name__ == "__main__":
    main()
