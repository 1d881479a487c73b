"""The one conversation builder: API-neutral dialog (+ stored history) → Harmony messages and prompt ids.

It is the only place that decides which chain of thought goes into a prompt: every replayed or stored
analysis message is kept in the dialog, and the renderer's SEEDS policy drops the CoT of completed turns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from harmony import (
    DeveloperContent,
    Message,
    ReasoningEffort,
    Renderer,
    ResponseFormat,
    Role,
    SystemContent,
    ToolDescription,
    ToolNamespace,
)

from ..errors import ApiError, invalid
from .dialog import Approval, Call, CallResult, DialogItem, Entry, Instruction, Said, Summary, Thought

FUNCTIONS_PREFIX = "functions."
# a compaction's summary, as the user turn that stands for the turns it replaced
SUMMARY_HEADING = (
    "[Summary of our conversation so far, which you wrote when it grew long; it stands for the earlier turns]\n\n"
)
JSON_CONTENT_TYPE = "<|constrain|>json"


@dataclass(slots=True)
class PromptSpec:
    """Everything of a request that shapes the prompt, already validated by the API skin."""

    items: list[DialogItem]
    instructions: list[str] = field(default_factory=list)
    history: list[Entry] = field(default_factory=list)
    tools: list[ToolDescription] = field(default_factory=list)  # the `functions` namespace
    namespaces: list[ToolNamespace] = field(default_factory=list)  # the client's own and MCP servers'
    builtin: list[ToolNamespace] = field(default_factory=list)  # browser, python: in the system message
    response_format: ResponseFormat | None = None
    effort: ReasoningEffort = ReasoningEffort.MEDIUM
    truncate: bool = False  # drop the oldest turns when the prompt does not fit (truncation=auto)


@dataclass(slots=True)
class BuiltPrompt:
    dialog: list[Entry]  # history + this request's items: what the store keeps (raw CoT included)
    tokens: list[int]
    dropped_entries: int = 0  # entries left out by truncation


def tool_message(recipient: str, output: str, channel: str = "commentary") -> Message:
    """A tool's answer to the assistant, on the channel the call was made on."""
    return Message.of(Role.TOOL, output, name=recipient, channel=channel, recipient="assistant")


def call_message(recipient: str, arguments: str, freeform: bool = False, channel: str = "commentary") -> Message:
    """A call as the model writes it: JSON arguments under `<|constrain|>json`, a freeform input bare."""
    content_type = None if freeform else JSON_CONTENT_TYPE
    return Message.of(Role.ASSISTANT, arguments, channel=channel, recipient=recipient, content_type=content_type)


def _is_preamble(items: list[DialogItem], index: int) -> bool:
    """An assistant text followed by a tool call before the turn ends is a commentary preamble."""
    for later in items[index + 1 :]:
        if isinstance(later, Call):
            return True
        if isinstance(later, CallResult) or (isinstance(later, Said) and later.role == "user"):
            return False
    return False


def entry_text(entry: Entry) -> str:
    """A plain-text message's text (a developer message of the dialog, a user turn)."""
    return "".join(part for part in entry.message.content if isinstance(part, str))


def summary_entry(summary: str) -> Entry:
    return Entry(Message.of(Role.USER, SUMMARY_HEADING + summary))


def dialog_entries(items: list[DialogItem], history: list[Entry]) -> list[Entry]:
    """Harmony entries for the request's items; tool outputs resolve their function name by call id."""
    names = {
        entry.call_id: (entry.message.recipient, entry.message.channel)
        for entry in history
        if entry.call_id is not None
    }
    entries: list[Entry] = []
    for index, item in enumerate(items):
        if isinstance(item, Said):
            if item.role == "user":
                entries.append(Entry(Message.of(Role.USER, item.text)))
                continue
            preamble = item.preamble if item.preamble is not None else _is_preamble(items, index)
            channel = "commentary" if preamble else "final"
            entries.append(Entry(Message.of(Role.ASSISTANT, item.text, channel=channel)))
        elif isinstance(item, Approval):
            continue  # not a message: the tool loop runs (or declines) the call it answers
        elif isinstance(item, Summary):
            entries.append(summary_entry(item.text))
        elif isinstance(item, Instruction):
            entries.append(Entry(Message.of(Role.DEVELOPER, item.text)))
        elif isinstance(item, Thought):
            if item.text:
                entries.append(Entry(Message.of(Role.ASSISTANT, item.text, channel="analysis")))
        elif isinstance(item, Call):
            names[item.call_id] = (item.recipient, item.channel)
            message = call_message(item.recipient, item.arguments, item.freeform, item.channel)
            entries.append(Entry(message, item.call_id))
        else:
            called = names.get(item.call_id)
            if called is None:
                raise invalid(
                    f"{item.param}.call_id",
                    f"No tool call found for function call output with call_id '{item.call_id}'.",
                )
            recipient, channel = called
            entries.append(Entry(tool_message(recipient or "", item.output, channel or "commentary")))
    return entries


def _header(spec: PromptSpec, today: str, hoisted: list[str]) -> list[Message]:
    """System and developer messages; `hoisted`: the dialog's developer messages, after the request's own
    instructions (spec.instructions[0]) and before the rest."""
    builtin = {namespace.name: namespace for namespace in spec.builtin} or None
    system = Message.of(
        Role.SYSTEM, SystemContent(reasoning_effort=spec.effort, conversation_start_date=today, tools=builtin)
    )
    instructions = [*spec.instructions[:1], *hoisted, *spec.instructions[1:]]
    developer = DeveloperContent(
        instructions="\n\n".join(text for text in instructions if text) or None,
        response_formats=[spec.response_format] if spec.response_format else [],
    )
    if spec.tools:
        developer.with_function_tools(spec.tools)
    if spec.namespaces:
        developer.tools = {**(developer.tools or {}), **{namespace.name: namespace for namespace in spec.namespaces}}
    if developer.instructions is None and not developer.tools and not developer.response_formats:
        return [system]
    return [system, Message.of(Role.DEVELOPER, developer)]


def _cut_points(dialog: list[Entry], truncate: bool) -> list[int]:
    """Where the rendered dialog may start: the beginning, then (with truncation) each later user turn."""
    later = [i for i, entry in enumerate(dialog) if i > 0 and entry.message.role is Role.USER]
    return [0, *later] if truncate else [0]


def build_prompt(renderer: Renderer, spec: PromptSpec, budget_tokens: int, today: str | None = None) -> BuiltPrompt:
    """Render the prompt; it must leave `budget_tokens` > 0 for the answer or truncation must make room."""
    dialog = [*spec.history, *dialog_entries(spec.items, spec.history)]
    hoisted = [entry_text(entry) for entry in dialog if entry.message.role is Role.DEVELOPER]
    body = [entry for entry in dialog if entry.message.role is not Role.DEVELOPER]
    header = _header(spec, today or datetime.now(UTC).date().isoformat(), hoisted)
    tokens: list[int] = []
    for dropped in _cut_points(body, spec.truncate):
        tokens = renderer.render_for_completion([*header, *(e.message for e in body[dropped:])])
        if len(tokens) < budget_tokens:
            return BuiltPrompt(dialog, tokens, dropped)
    raise ApiError(
        400,
        f"The input is {len(tokens)} tokens, which leaves no room for output in the model's context "
        f"of {budget_tokens} tokens.",
        param="input",
        code="context_length_exceeded",
    )


def check_prompt_fits(renderer: Renderer, spec: PromptSpec, budget_tokens: int, whole: bool) -> None:
    """build_prompt's context_length_exceeded where it must come, from a spec of the request alone (a checker
    process's); `whole`: nothing stored or server-side adds to it, else its count is a lower bound."""
    try:
        build_prompt(renderer, spec, budget_tokens)
    except ApiError as exc:
        if exc.code == "context_length_exceeded" and not whole:
            exc.message = exc.message.replace("The input is ", "The input is at least ", 1)
        raise
