"""The examples of the Harmony format guide (../shared/seeds), as conversations and expected text."""

from __future__ import annotations

from harmony import (
    DeveloperContent,
    Message,
    ReasoningEffort,
    ResponseFormat,
    Role,
    SystemContent,
    ToolDescription,
    browser_namespace,
    python_namespace,
)

DATE = "2025-06-28"

WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {
        "location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"},
        "format": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
    },
    "required": ["location"],
}
MULTI_WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {
        "locations": {
            "type": "array",
            "items": {"type": "string"},
            "description": 'List of city and state, e.g. ["San Francisco, CA", "New York, NY"]',
        },
        "format": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
    },
    "required": ["locations"],
}


def system_high(**kwargs) -> Message:
    return Message.of(
        Role.SYSTEM, SystemContent(reasoning_effort=ReasoningEffort.HIGH, conversation_start_date=DATE, **kwargs)
    )


def weather_developer(instructions: str) -> Message:
    return Message.of(
        Role.DEVELOPER,
        DeveloperContent(instructions=instructions).with_function_tools(
            [
                ToolDescription("get_location", "Gets the location of the user."),
                ToolDescription(
                    "get_current_weather", "Gets the current weather in the provided location.", WEATHER_PARAMETERS
                ),
                ToolDescription(
                    "get_multiple_weathers",
                    "Gets the current weather in the provided list of locations.",
                    MULTI_WEATHER_PARAMETERS,
                ),
            ]
        ),
    )


SYSTEM_TEXT = (
    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
    "Knowledge cutoff: 2024-06\nCurrent date: 2025-06-28\n\nReasoning: high\n\n"
    "# Valid channels: analysis, commentary, final. Channel must be included for every message."
)
FUNCTIONS_LINE = "\nCalls to these tools must go to the commentary channel: 'functions'."

FUNCTION_CALLING_PROMPT = (
    SYSTEM_TEXT
    + FUNCTIONS_LINE
    + """<|end|><|start|>developer<|message|># Instructions

Use a friendly tone.

# Tools

## functions

namespace functions {

// Gets the location of the user.
type get_location = () => any;

// Gets the current weather in the provided location.
type get_current_weather = (_: {
// The city and state, e.g. San Francisco, CA
location: string,
format?: "celsius" | "fahrenheit", // default: celsius
}) => any;

// Gets the current weather in the provided list of locations.
type get_multiple_weathers = (_: {
// List of city and state, e.g. ["San Francisco, CA", "New York, NY"]
locations: string[],
format?: "celsius" | "fahrenheit", // default: celsius
}) => any;

} // namespace functions<|end|><|start|>user<|message|>What is the weather like in SF?<|end|><|start|>assistant"""
)

TOOL_ROUND_TRIP_TAIL = (
    "<|channel|>analysis<|message|>Need to use function get_current_weather.<|end|>"
    "<|start|>assistant to=functions.get_current_weather<|channel|>commentary <|constrain|>json<|message|>"
    '{"location":"San Francisco"}<|call|>'
    "<|start|>functions.get_current_weather to=assistant<|channel|>commentary<|message|>"
    '{"sunny": true, "temperature": 20}<|end|><|start|>assistant'
)

BROWSER_SYSTEM = """<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.
Knowledge cutoff: 2024-06
Current date: 2025-06-28

Reasoning: high

# Tools

## browser

// Tool for browsing.
// The `cursor` appears in brackets before each browsing display: `[{cursor}]`.
// Cite information from the tool using the following format:
// `【{cursor}†L{line_start}(-L{line_end})?】`, for example: `【6†L9-L11】` or `【8†L3】`.
// Do not quote more than 10 words directly from the tool output.
// sources=web (default: web)
namespace browser {

// Searches for information related to `query` and displays `topn` results.
type search = (_: {
query: string,
topn?: number, // default: 10
source?: string,
}) => any;

// Opens the link `id` from the page indicated by `cursor` starting at line number `loc`, showing `num_lines` lines.
// Valid link ids are displayed with the formatting: `【{id}†.*】`.
// If `cursor` is not provided, the most recent page is implied.
// If `id` is a string, it is treated as a fully qualified URL associated with `source`.
// If `loc` is not provided, the viewport will be positioned at the beginning of the document or centered on the most relevant passage, if available.
// Use this function without `id` to scroll to a new location of an opened page.
type open = (_: {
id?: number | string, // default: -1
cursor?: number, // default: -1
loc?: number, // default: -1
num_lines?: number, // default: -1
view_source?: boolean, // default: false
source?: string,
}) => any;

// Finds exact matches of `pattern` in the current page, or the page given by `cursor`.
type find = (_: {
pattern: string,
cursor?: number, // default: -1
}) => any;

} // namespace browser

# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>"""

PYTHON_SYSTEM = """<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.
Knowledge cutoff: 2024-06
Current date: 2025-06-28

Reasoning: high

# Tools

## python

Use this tool to execute Python code in your chain of thought. The code will not be shown to the user. This tool should be used for internal reasoning, but not for code that is intended to be visible to the user (e.g. when creating plots, tables, or files).

When you send a message containing Python code to python, it will be executed in a stateful Jupyter notebook environment. python will respond with the output of the execution or time out after 120.0 seconds. The drive at '/mnt/data' can be used to save and persist user files. Internet access for this session is UNKNOWN. Depends on the cluster.

# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>"""

SHOPPING_SCHEMA = {
    "properties": {
        "items": {"type": "array", "description": "entries on the shopping list", "items": {"type": "string"}}
    },
    "type": "object",
}
SHOPPING_PROMPT = (
    "<|start|>developer<|message|># Instructions\n\nYou are a helpful shopping assistant\n\n"
    "# Response Formats\n\n## shopping_list\n\n"
    '{"properties":{"items":{"type":"array","description":"entries on the shopping list",'
    '"items":{"type":"string"}}},"type":"object"}<|end|>'
    "<|start|>user<|message|>I need to buy coffee, soda and eggs<|end|><|start|>assistant"
)


def shopping_messages() -> list[Message]:
    return [
        Message.of(
            Role.DEVELOPER,
            DeveloperContent(
                instructions="You are a helpful shopping assistant",
                response_formats=[ResponseFormat("shopping_list", SHOPPING_SCHEMA)],
            ),
        ),
        Message.of(Role.USER, "I need to buy coffee, soda and eggs"),
    ]


def builtin_system(namespace_factory) -> Message:
    namespace = namespace_factory()
    return Message.of(
        Role.SYSTEM,
        SystemContent(
            reasoning_effort=ReasoningEffort.HIGH,
            conversation_start_date=DATE,
            tools={namespace.name: namespace},
        ),
    )


BUILTIN_EXAMPLES = [(browser_namespace, BROWSER_SYSTEM), (python_namespace, PYTHON_SYSTEM)]

# The 2 + 2 example of the streaming-parser section: token ids as printed in the guide.
STREAM_EXAMPLE_TOKENS = [
    200005, 35644, 200008, 1844, 31064, 25, 392, 4827, 382, 220, 17, 659, 220, 17, 16842, 12295, 81645,
    13, 51441, 6052, 13, 200007, 200006, 173781, 200005, 17196, 200008, 17, 659, 220, 17, 314, 220, 19,
    13, 200002,
]  # fmt: skip
