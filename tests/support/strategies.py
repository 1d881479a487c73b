"""Hypothesis strategies: JSON Schemas with every keyword the renderer reads, conversations, and hostile
model output."""

from __future__ import annotations

from hypothesis import strategies as st

from harmony import (
    ChannelConfig,
    DeveloperContent,
    Message,
    ReasoningEffort,
    Role,
    SystemContent,
    ToolDescription,
    ToolNamespace,
)
from harmony.tokens import FIRST_SPECIAL, LAST_SPECIAL

texts = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=24)
short_words = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_.-0123456789", min_size=1, max_size=12)

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(texts, children, max_size=3),
    max_leaves=6,
)

TYPES = ["string", "number", "integer", "boolean", "array", "object", "null", "date"]

_annotations = {
    "description": texts,
    "default": json_values,
    "nullable": st.sampled_from([True, False, "true"]),
    "title": texts,
    "examples": st.lists(texts | st.integers(), max_size=3),
    "enum": st.lists(texts | st.integers() | st.none(), max_size=4),
}
leaf_schemas = st.fixed_dictionaries({"type": st.sampled_from(TYPES)}, optional=_annotations)


def _extend(children):
    properties = st.dictionaries(texts, children, max_size=4)
    objects = properties.flatmap(
        lambda props: st.fixed_dictionaries(
            {"type": st.just("object"), "properties": st.just(props)},
            optional={
                "required": st.lists(st.sampled_from([*props, "missing"]) if props else st.just("missing"), max_size=3),
                **_annotations,
            },
        )
    )
    arrays = st.fixed_dictionaries({"type": st.just("array")}, optional={"items": children, **_annotations})
    one_ofs = st.fixed_dictionaries({"oneOf": st.lists(children, max_size=3)}, optional=_annotations)
    type_lists = st.fixed_dictionaries(
        {"type": st.lists(st.sampled_from(TYPES) | st.integers(), max_size=3)},
        optional={"properties": properties},
    )
    others = st.fixed_dictionaries({}, optional={"anyOf": st.lists(children, max_size=2), "const": json_scalars})
    return objects | arrays | one_ofs | type_lists | others


schemas = st.recursive(leaf_schemas, _extend, max_leaves=10)
tool_schemas = st.one_of(
    st.none(),
    st.builds(lambda props: {"type": "object", "properties": props}, st.dictionaries(texts, schemas, max_size=4)),
    schemas,
)

tools = st.builds(ToolDescription, short_words, texts, tool_schemas)
namespaces = st.builds(
    lambda name, description, items: ToolNamespace(name, description, items),
    short_words,
    st.none() | texts,
    st.lists(tools, max_size=3),
)
namespace_maps = st.none() | st.lists(namespaces, max_size=3).map(lambda nss: {ns.name: ns for ns in nss})
function_namespace = st.lists(tools, max_size=3).map(lambda ts: {"functions": ToolNamespace("functions", None, ts)})

system_contents = st.builds(
    SystemContent,
    model_identity=st.none() | texts,
    reasoning_effort=st.none() | st.sampled_from(list(ReasoningEffort)),
    knowledge_cutoff=st.none() | texts,
    conversation_start_date=st.none() | texts,
    channel_config=st.none() | st.builds(ChannelConfig, st.lists(short_words, max_size=3).map(tuple), st.booleans()),
    tools=namespace_maps,
)
developer_contents = st.builds(
    DeveloperContent,
    instructions=st.none() | texts,
    tools=namespace_maps | function_namespace,
)

channels = st.none() | st.sampled_from(["analysis", "commentary", "final"]) | short_words
content_types = st.none() | st.sampled_from(
    ["json", "<|constrain|>json", "<|constrain|>", "<|constrain|> json", "code"]
)
recipients = st.none() | st.sampled_from(["functions.get_weather", "python", "browser.search", "assistant", "all"])
text_parts = st.lists(texts, min_size=1, max_size=3)


def _text_message(role: Role):
    name = short_words if role is Role.TOOL else st.none() | short_words
    return st.builds(
        lambda n, c, ch, r, ct: Message.of(role, c, name=n, channel=ch, recipient=r, content_type=ct),
        name,
        text_parts,
        channels,
        recipients,
        content_types,
    )


chat_messages = st.one_of(
    _text_message(Role.USER), _text_message(Role.ASSISTANT), _text_message(Role.TOOL), _text_message(Role.ASSISTANT)
)
conversations = st.builds(
    lambda system, developer, rest: [m for m in (system, developer) if m is not None] + rest,
    st.none() | system_contents.map(lambda c: Message.of(Role.SYSTEM, c)),
    st.none() | developer_contents.map(lambda c: Message.of(Role.DEVELOPER, c)),
    st.lists(chat_messages, max_size=8),
)


# model output at its most hostile: ordinary tokens, Harmony's special tokens (often), reserved specials,
# ids outside the vocabulary, and the tokens of header words
special_heavy_tokens = st.lists(
    st.one_of(
        st.integers(min_value=0, max_value=FIRST_SPECIAL - 1),
        st.sampled_from([200002, 200003, 200005, 200006, 200007, 200008, 200012, 199998, 199999, 200013]),
        st.integers(min_value=FIRST_SPECIAL, max_value=LAST_SPECIAL),
        st.integers(min_value=-5, max_value=10**6),
        st.sampled_from([173781, 35644, 17196, 12606, 26, 220, 28, 2]),  # assistant, analysis, final, to, =, ...
    ),
    max_size=80,
)
