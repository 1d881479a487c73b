"""Every example of the Harmony format guide: our renderer against the guide's text and the reference."""

from __future__ import annotations

import pytest
from reference import harmony_module, reference_encoding, reference_render, to_reference
from seeds_examples import (
    BUILTIN_EXAMPLES,
    DATE,
    FUNCTION_CALLING_PROMPT,
    FUNCTIONS_LINE,
    SHOPPING_PROMPT,
    STREAM_EXAMPLE_TOKENS,
    SYSTEM_TEXT,
    TOOL_ROUND_TRIP_TAIL,
    WEATHER_PARAMETERS,
    builtin_system,
    shopping_messages,
    system_high,
    weather_developer,
)

from harmony import CotPolicy, DeveloperContent, Message, Role, SystemContent
from harmony.parser import parse_completion
from harmony.render import Renderer


def both(renderer, messages, mode="completion", policy=CotPolicy.REFERENCE):
    if mode == "completion":
        ours = renderer.render_for_completion(messages, cot=policy)
    elif mode == "training":
        ours = renderer.render_for_training(messages, cot=policy)
    else:
        ours = renderer.render_conversation(messages, cot=policy)
    return ours, reference_render(messages, mode, policy)


def test_renderer_library_example(renderer):
    from harmony import ToolDescription

    developer = Message.of(
        Role.DEVELOPER,
        DeveloperContent(instructions="Always respond in riddles").with_function_tools(
            [
                ToolDescription(
                    "get_current_weather", "Gets the current weather in the provided location.", WEATHER_PARAMETERS
                )
            ]
        ),
    )
    messages = [
        system_high(),
        developer,
        Message.of(Role.USER, "What is the weather in Tokyo?"),
        Message.of(
            Role.ASSISTANT,
            'User asks: "What is the weather in Tokyo?" We need to use get_current_weather tool.',
            channel="analysis",
        ),
        Message.of(
            Role.ASSISTANT,
            '{"location": "Tokyo"}',
            channel="commentary",
            recipient="functions.get_current_weather",
            content_type="<|constrain|> json",
        ),
        Message.of(
            Role.TOOL,
            '{ "temperature": 20, "sunny": true }',
            name="functions.get_current_weather",
            channel="commentary",
        ),
    ]
    ours, ref = both(renderer, messages)
    assert ours == ref
    assert renderer.encoding.decode(ours).endswith(
        '<|start|>functions.get_current_weather<|channel|>commentary<|message|>{ "temperature": 20, "sunny": true }'
        "<|end|><|start|>assistant"
    )


def test_python_api_reference_example(renderer):
    """The English API page's variant: content type `json`, a tool reply with recipient assistant."""
    from harmony import ToolDescription

    developer = Message.of(
        Role.DEVELOPER,
        DeveloperContent(instructions="Always respond in riddles").with_function_tools(
            [
                ToolDescription("get_location", "Gets the location of the user."),
                ToolDescription(
                    "get_current_weather", "Gets the current weather in the provided location.", WEATHER_PARAMETERS
                ),
            ]
        ),
    )
    messages = [
        Message.of(Role.SYSTEM, SystemContent(reasoning_effort=None, conversation_start_date=DATE)),
        developer,
        Message.of(Role.USER, "What is the weather in Tokyo?"),
        Message.of(Role.ASSISTANT, "We need to use get_weather tool.", channel="analysis"),
        Message.of(
            Role.ASSISTANT,
            '{"location": "Tokyo"}',
            channel="commentary",
            recipient="functions.get_weather",
            content_type="json",
        ),
        Message.of(
            Role.TOOL,
            '{ "temperature": 20, "sunny": true }',
            name="functions.lookup_weather",
            recipient="assistant",
            channel="commentary",
        ),
    ]
    ours, ref = both(renderer, messages)
    assert ours == ref
    assert (
        "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
        in renderer.encoding.decode(ours)
    )


def test_basic_chat_input(renderer):
    ours, ref = both(renderer, [Message.of(Role.USER, "What is 2 + 2?")])
    assert ours == ref
    assert renderer.encoding.decode(ours) == "<|start|>user<|message|>What is 2 + 2?<|end|><|start|>assistant"


@pytest.mark.parametrize("with_functions", [False, True])
def test_system_message_examples(renderer, with_functions):
    text = renderer.encoding.decode(renderer.render_message(system_high(), function_tools=with_functions))
    assert text == SYSTEM_TEXT + (FUNCTIONS_LINE if with_functions else "") + "<|end|>"
    oh = harmony_module()
    ref = reference_encoding().render(
        to_reference(system_high()), oh.RenderOptions(conversation_has_function_tools=with_functions)
    )
    assert renderer.render_message(system_high(), function_tools=with_functions) == ref


def test_developer_message_without_tools(renderer):
    message = Message.of(Role.DEVELOPER, DeveloperContent(instructions="{instructions}"))
    assert renderer.encoding.decode(renderer.render_message(message)) == (
        "<|start|>developer<|message|># Instructions\n\n{instructions}<|end|>"
    )
    ours, ref = both(renderer, [message], mode="conversation")
    assert ours == ref


def test_function_calling_prompt(renderer):
    messages = [
        system_high(),
        weather_developer("Use a friendly tone."),
        Message.of(Role.USER, "What is the weather like in SF?"),
    ]
    ours, ref = both(renderer, messages)
    assert ours == ref
    assert renderer.encoding.decode(ours) == FUNCTION_CALLING_PROMPT


def tool_round_trip_messages() -> list[Message]:
    return [
        system_high(),
        weather_developer("Use a friendly tone."),
        Message.of(Role.USER, "What is the weather like in SF?"),
        Message.of(Role.ASSISTANT, "Need to use function get_current_weather.", channel="analysis"),
        Message.of(
            Role.ASSISTANT,
            '{"location":"San Francisco"}',
            channel="commentary",
            recipient="functions.get_current_weather",
            content_type="<|constrain|>json",
        ),
        Message.of(
            Role.TOOL,
            '{"sunny": true, "temperature": 20}',
            name="functions.get_current_weather",
            recipient="assistant",
            channel="commentary",
        ),
    ]


@pytest.mark.parametrize("policy", [CotPolicy.SEEDS, CotPolicy.REFERENCE])
def test_tool_round_trip_keeps_the_cot_of_the_turn_in_progress(renderer, policy):
    ours, ref = both(renderer, tool_round_trip_messages(), policy=policy)
    assert ours == ref
    # The guide writes the recipient after the channel; the renderer (ours and the reference)
    # always puts it in the role part of the header, which the guide allows.
    assert renderer.encoding.decode(ours) == FUNCTION_CALLING_PROMPT + TOOL_ROUND_TRIP_TAIL


def test_the_gateways_layout_writes_the_recipient_after_the_channel_as_the_guide_and_the_model_do(renderer):
    """The gateway renders with `recipient_in_channel`: the guide's own history text, holding token for token
    what the model wrote (so the prefix cache reuses it); tool messages keep their recipient in the role part."""
    gateway = Renderer(renderer.encoding, recipient_in_channel=True)
    messages = tool_round_trip_messages()
    ours = gateway.render_for_completion(messages)
    guide_tail = TOOL_ROUND_TRIP_TAIL.replace(
        "assistant to=functions.get_current_weather<|channel|>commentary",
        "assistant<|channel|>commentary to=functions.get_current_weather",
    )
    assert gateway.encoding.decode(ours) == FUNCTION_CALLING_PROMPT + guide_tail
    asked = gateway.render_for_completion(messages[:3])
    written = gateway.encoding.encode_marked(guide_tail[: guide_tail.index("<|start|>functions")])
    assert ours[: len(asked) + len(written)] == asked + written


def test_cot_of_a_completed_turn_is_dropped(renderer):
    messages = [
        Message.of(Role.USER, "What is 2 + 2?"),
        Message.of(
            Role.ASSISTANT, 'User asks: "What is 2 + 2?" Simple arithmetic. Provide answer.', channel="analysis"
        ),
        Message.of(Role.ASSISTANT, "2 + 2 = 4.", channel="final"),
        Message.of(Role.USER, "What about 9 / 2?"),
    ]
    expected = (
        "<|start|>user<|message|>What is 2 + 2?<|end|>"
        "<|start|>assistant<|channel|>final<|message|>2 + 2 = 4.<|end|>"
        "<|start|>user<|message|>What about 9 / 2?<|end|><|start|>assistant"
    )
    for policy in (CotPolicy.SEEDS, CotPolicy.REFERENCE):
        ours, ref = both(renderer, messages, policy=policy)
        assert ours == ref
        assert renderer.encoding.decode(ours) == expected


def test_structured_output_developer_message(renderer):
    ours = renderer.render_for_completion(shopping_messages())
    assert renderer.encoding.decode(ours) == SHOPPING_PROMPT
    # The reference has no response formats; without tools the section order equals instructions text.
    as_instructions = [
        Message.of(
            Role.DEVELOPER,
            DeveloperContent(instructions=SHOPPING_PROMPT.split("# Instructions\n\n", 1)[1].split("<|end|>", 1)[0]),
        ),
        shopping_messages()[1],
    ]
    assert ours == reference_render(as_instructions)


@pytest.mark.parametrize(("factory", "expected"), BUILTIN_EXAMPLES)
def test_builtin_tool_system_messages(renderer, factory, expected):
    message = builtin_system(factory)
    assert renderer.encoding.decode(renderer.render_message(message)) == expected
    ours, ref = both(renderer, [message], mode="conversation")
    assert ours == ref


def test_streaming_parser_example(encoding):
    oh = harmony_module()
    reference = reference_encoding().parse_messages_from_completion_tokens(STREAM_EXAMPLE_TOKENS, oh.Role.ASSISTANT)
    parsed = parse_completion(STREAM_EXAMPLE_TOKENS)
    assert not parsed.repairs
    assert [(m.channel, m.text) for m in parsed.messages] == [(m.channel, m.content[0].text) for m in reference]
    assert parsed.messages[1].text == "2 + 2 = 4."


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        (
            '<|channel|>analysis<|message|>User asks: "What is 2 + 2?" Simple arithmetic. Provide answer.<|end|>'
            "<|start|>assistant<|channel|>final<|message|>2 + 2 = 4.<|return|>",
            [
                ("analysis", None, None, 'User asks: "What is 2 + 2?" Simple arithmetic. Provide answer.'),
                ("final", None, None, "2 + 2 = 4."),
            ],
        ),
        (
            "<|channel|>analysis<|message|>Need to use function get_current_weather.<|end|><|start|>assistant"
            '<|channel|>commentary to=functions.get_current_weather <|constrain|>json<|message|>{"location":"San Francisco"}<|call|>',
            [
                ("analysis", None, None, "Need to use function get_current_weather."),
                ("commentary", "functions.get_current_weather", "<|constrain|>json", '{"location":"San Francisco"}'),
            ],
        ),
        (
            "<|channel|>analysis<|message|>{long chain of thought}<|end|><|start|>assistant<|channel|>commentary"
            "<|message|>**Action plan**:\n1. Generate an HTML file\n2. Generate a JavaScript for the Node.js server\n"
            "3. Start the server\n---\nWill start executing the plan step by step<|end|><|start|>assistant<|channel|>"
            'commentary to=functions.generate_file<|constrain|>json<|message|>{"template": "basic_html", "path": "index.html"}<|call|>',
            [
                ("analysis", None, None, "{long chain of thought}"),
                (
                    "commentary",
                    None,
                    None,
                    "**Action plan**:\n1. Generate an HTML file\n2. Generate a JavaScript for the Node.js server\n"
                    "3. Start the server\n---\nWill start executing the plan step by step",
                ),
                (
                    "commentary",
                    "functions.generate_file",
                    "<|constrain|>json",
                    '{"template": "basic_html", "path": "index.html"}',
                ),
            ],
        ),
        (
            "<|channel|>analysis<|message|>用户询问北京天气，需要调用 get_weather。<|end|><|start|>assistant<|channel|>"
            'commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"北京"}<|call|>',
            [
                ("analysis", None, None, "用户询问北京天气，需要调用 get_weather。"),
                ("commentary", "functions.get_weather", "<|constrain|>json", '{"city":"北京"}'),
            ],
        ),
    ],
    ids=["two-plus-two", "tool-call", "preamble", "zh-tool-call"],
)
def test_guide_outputs_parse_like_the_reference(tok, output, expected):
    tokens = tok(output)
    parsed = parse_completion(tokens)
    assert not parsed.repairs
    got = [(m.channel, m.recipient, m.content_type, m.text) for m in parsed.messages]
    assert got == expected
    oh = harmony_module()
    ref = reference_encoding().parse_messages_from_completion_tokens(tokens, oh.Role.ASSISTANT)
    assert got == [(m.channel, m.recipient, m.content_type, m.content[0].text) for m in ref]


def test_chinese_guide_function_definitions(renderer):
    """The namespace block of the function-calling guide (zh), rendered from JSON Schemas."""
    from harmony import ToolDescription
    from harmony.prompt_text import tools_section
    from harmony.types import ToolNamespace

    tools = [
        ToolDescription(
            "get_weather",
            "获取指定城市的天气信息",
            {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "城市名称，如：北京、上海"},
                    "unit": {
                        "type": "string",
                        "description": "温度单位",
                        "enum": ["celsius", "fahrenheit"],
                        "default": "celsius",
                    },
                },
                "required": ["city"],
            },
        ),
        ToolDescription(
            "web_search",
            "搜索网页获取信息",
            {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "搜索关键词"},
                    "limit": {"type": "integer", "description": "返回结果数量", "default": 5},
                },
                "required": ["query"],
            },
        ),
        ToolDescription("get_current_time", "获取当前时间"),
    ]
    text = tools_section({"functions": ToolNamespace("functions", None, tools)})
    assert (
        text
        == """# Tools

## functions

namespace functions {

// 获取指定城市的天气信息
type get_weather = (_: {
// 城市名称，如：北京、上海
city: string,
// 温度单位
unit?: "celsius" | "fahrenheit", // default: celsius
}) => any;

// 搜索网页获取信息
type web_search = (_: {
// 搜索关键词
query: string,
// 返回结果数量
limit?: number, // default: 5
}) => any;

// 获取当前时间
type get_current_time = () => any;

} // namespace functions"""
    )
    developer = Message.of(
        Role.DEVELOPER, DeveloperContent(instructions="你是一个有帮助的AI助手。").with_function_tools(tools)
    )
    ours, ref = both(renderer, [system_high(), developer, Message.of(Role.USER, "北京天气怎么样？")])
    assert ours == ref
