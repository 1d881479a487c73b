"""The text of system and developer messages: sections, tool namespaces, response formats."""

from __future__ import annotations

import json

from .schema_ts import rust_lines, to_typescript
from .types import DeveloperContent, Message, ResponseFormat, SystemContent, ToolDescription, ToolNamespace

FUNCTIONS = "functions"


def has_function_tools(messages: list[Message]) -> bool:
    """True iff a developer message declares a non-empty `functions` namespace (the reference's test)."""
    for message in messages:
        for part in message.content:
            if isinstance(part, DeveloperContent) and part.tools:
                namespace = part.tools.get(FUNCTIONS)
                if namespace is not None and namespace.tools:
                    return True
    return False


_TOOL_TEXTS: dict[tuple[str, str, str, str | None], str] = {}
FREEFORM_NOTE = "This tool's input is raw text, not JSON: write the input itself as the message."
_TOOL_TEXT_LIMIT = 4096


def _tool_text(tool: ToolDescription) -> str:
    """A tool's comment and TypeScript signature, cached by its content (name, description, schema as
    JSON in its own key order): requests rebuild their tool objects, the conversion is done once."""
    schema = tool.schema_json if tool.schema_json is not None else json.dumps(tool.parameters, separators=(",", ":"))
    key = (tool.name, tool.description, schema, tool.freeform)
    text = _TOOL_TEXTS.get(key)
    if text is None:
        lines = [f"// {line}" for line in rust_lines(tool.description)]
        if tool.freeform is not None:
            lines.append(f"// {FREEFORM_NOTE}")
            lines.extend(f"// {line}" for line in rust_lines(tool.freeform))
            lines.append(f"type {tool.name} = (_: string) => any;\n")
        elif tool.parameters is not None:
            lines.append(f"type {tool.name} = (_: {to_typescript(tool.parameters)}) => any;\n")
        else:
            lines.append(f"type {tool.name} = () => any;\n")
        text = "\n".join(lines)
        if len(_TOOL_TEXTS) >= _TOOL_TEXT_LIMIT:
            _TOOL_TEXTS.clear()
        _TOOL_TEXTS[key] = text
    return text


def clear_tool_texts() -> None:
    _TOOL_TEXTS.clear()


def _namespace_text(namespace: ToolNamespace) -> str:
    lines = [f"## {namespace.name}\n"]
    if namespace.description is not None:
        prefix = "// " if namespace.tools else ""
        lines.extend(prefix + line for line in rust_lines(namespace.description))
    if namespace.tools:
        lines.append(f"namespace {namespace.name} {{\n")
        lines.extend(_tool_text(tool) for tool in namespace.tools)
        lines.append(f"}} // namespace {namespace.name}")
    return "\n".join(lines)


def tools_section(tools: dict[str, ToolNamespace]) -> str:
    """`# Tools`, namespaces sorted by key (byte order, as a BTreeMap iterates)."""
    keys = sorted(tools, key=lambda k: k.encode())
    return "\n\n".join(["# Tools", *(_namespace_text(tools[k]) for k in keys)])


def _response_format_text(fmt: ResponseFormat) -> str:
    schema = json.dumps(fmt.schema, ensure_ascii=False, separators=(",", ":"))
    if fmt.description:
        return f"## {fmt.name}\n\n// {fmt.description}\n{schema}"
    return f"## {fmt.name}\n\n{schema}"


def response_formats_section(formats: list[ResponseFormat]) -> str:
    """`# Response Formats` as the format guide documents it (the reference cannot emit it)."""
    return "\n\n".join(["# Response Formats", *(_response_format_text(f) for f in formats)])


def system_sections(content: SystemContent, function_tools: bool) -> list[str]:
    """The system message's sections, in order; its text is them joined by blank lines."""
    header = [
        line
        for line in (
            content.model_identity,
            None if content.knowledge_cutoff is None else f"Knowledge cutoff: {content.knowledge_cutoff}",
            None if content.conversation_start_date is None else f"Current date: {content.conversation_start_date}",
        )
        if line is not None
    ]
    sections = ["\n".join(header)] if header else []
    if content.reasoning_effort is not None:
        sections.append(f"Reasoning: {content.reasoning_effort.value}")
    if content.tools:
        sections.append(tools_section(content.tools))
    channels = content.channel_config
    if channels is not None and channels.valid_channels:
        line = f"# Valid channels: {', '.join(channels.valid_channels)}."
        if channels.channel_required:
            line += " Channel must be included for every message."
        if function_tools:
            line += "\nCalls to these tools must go to the commentary channel: 'functions'."
        sections.append(line)
    return sections


def developer_sections(content: DeveloperContent) -> list[str]:
    """The developer message's sections, in order; its text is them joined by blank lines."""
    sections = []
    if content.instructions is not None:
        sections.append(f"# Instructions\n\n{content.instructions}")
    if content.tools:
        sections.append(tools_section(content.tools))
    if content.response_formats:
        sections.append(response_formats_section(content.response_formats))
    return sections


def _starts_a_piece(text: str) -> bool:
    """Whether o200k's pre-tokenizer ends a piece before this text whenever a newline precedes it: a
    piece runs on past a newline only through whitespace, or through `/` after punctuation."""
    return bool(text) and not text[0].isspace() and text[0] != "/"


def token_pieces(sections: list[str]) -> list[str]:
    """The sections joined by blank lines, cut after each blank line that a new piece always follows.

    Encoding the parts one by one gives the tokens of the whole text, so each part's tokens can be
    cached on their own: the tools section's survive a change of instructions."""
    pieces: list[str] = []
    for section in sections:
        if not pieces:
            pieces.append(section)
        elif _starts_a_piece(section):
            pieces[-1] += "\n\n"
            pieces.append(section)
        else:
            pieces[-1] += "\n\n" + section
    return pieces
