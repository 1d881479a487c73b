"""Attention over a paged KV cache: the `gptoss.engine::PagedAttention` node and its portable realization.

A layer's cache is one pool of pages, `[pages x page_size, kv_heads, head_dim]`, shared by every sequence of
the step: a row's page table names, for each of its logical pages (positions [p x page_size, (p + 1) x
page_size)), the physical page that holds them. The step's tokens are ragged: token t belongs to row
`token_rows[t]` at `positions[t]`, so prefill chunks and decode rows run in one call. Each token first writes
its key (rotated: gpt-oss's half-split YaRN rotary, the tables carrying the concentration) and value into its
page, then attends its row's positions up to its own (the last `window` of them on sliding layers) with the
head's learned sink as one more logit of the softmax.

The compiled kernels (kernels/paged_attention_*) realize the node on the CPU and CUDA; without them, the
model-local function below does, in standard ops: ScatterND into the cache (bound in place, so nothing is
copied), each token's keys gathered through its row's page table, and the attention in float32 whatever the
dtype. That gathers [tokens, positions, kv_heads, head_dim] per layer: `FUNCTION_GATHER_BUDGET` bounds the
tokens a step may run against a context (runtime.py splits prefill chunks by it).
"""

from __future__ import annotations

import math

import onnx
from onnx import AttributeProto, TensorProto, helper

from .config import ModelConfig
from .opsets import ENGINE_DOMAIN, OPSET

INPUTS = ["qkv", "key_cache", "value_cache", "positions", "token_rows", "page_table", "cos_cache", "sin_cache", "sinks"]
ATTRIBUTES = ("num_heads", "kv_num_heads", "page_size", "window", "scale")
FUNCTION_GATHER_BUDGET = 1 << 20  # token x position pairs one step gathers keys for, in the function realization
NO_WINDOW = 1 << 40


def attention_attributes(config: ModelConfig, layer: int, page_size: int) -> dict[str, int | float]:
    """What a layer's PagedAttention node carries."""
    return {
        "num_heads": config.num_attention_heads,
        "kv_num_heads": config.num_key_value_heads,
        "page_size": page_size,
        "window": config.sliding_window if config.is_sliding(layer) else 0,
        "scale": 1 / math.sqrt(config.head_dim),
    }


def _attribute_constant(output: str, attribute: str, kind: int) -> onnx.NodeProto:
    """A Constant whose value is the function call's attribute `attribute`."""
    node = helper.make_node("Constant", [], [output])
    field = "value_int" if kind == AttributeProto.INT else "value_float"
    reference = helper.make_attribute_ref(field, kind)
    reference.ref_attr_name = attribute
    node.attribute.append(reference)
    return node


def paged_attention_function() -> onnx.FunctionProto:
    """`PagedAttention(qkv, key_cache, value_cache, positions, token_rows, page_table, cos_cache, sin_cache, sinks)
    -> (out, present_key, present_value)`, in standard ops (see the module's docstring)."""
    node = helper.make_node
    int64, float32 = TensorProto.INT64, TensorProto.FLOAT

    def constant(name: str, kind: int, dims: list[int], values: list) -> onnx.NodeProto:
        return node("Constant", [], [name], value=helper.make_tensor(name, kind, dims, values))

    nodes = [
        _attribute_constant("heads_s", "num_heads", AttributeProto.INT),
        _attribute_constant("page_s", "page_size", AttributeProto.INT),
        _attribute_constant("window_s", "window", AttributeProto.INT),
        _attribute_constant("scale", "scale", AttributeProto.FLOAT),
        constant("one", int64, [1], [1]),
        constant("two", int64, [1], [2]),
        constant("three", int64, [1], [3]),
        constant("zero", int64, [1], [0]),
        constant("minus_one", int64, [1], [-1]),
        constant("zero_s", int64, [], [0]),
        constant("one_s", int64, [], [1]),
        constant("no_window", int64, [], [NO_WINDOW]),
        constant("rows_axis", int64, [1], [1]),
        constant("masked", float32, [], [-math.inf]),
        node("Reshape", ["heads_s", "one"], ["heads"]),
        node("Shape", ["key_cache"], ["cache_shape"]),
        node("Slice", ["cache_shape", "one", "two"], ["kv_heads"]),
        node("Slice", ["cache_shape", "two", "three"], ["head_dim"]),
        node("Div", ["heads", "kv_heads"], ["group"]),
        node("Mul", ["heads", "head_dim"], ["q_width"]),
        node("Mul", ["kv_heads", "head_dim"], ["kv_width"]),
        node("Concat", ["q_width", "kv_width", "kv_width"], ["widths"], axis=0),
        node("Cast", ["qkv"], ["qkv32"], to=float32),
        node("Split", ["qkv32", "widths"], ["q", "k", "v"], axis=1),
        # the rotary angles of each token's position, [T, 1, D/2]
        node("Cast", ["positions"], ["pos"], to=int64),
        node("Cast", ["cos_cache"], ["cos32"], to=float32),
        node("Cast", ["sin_cache"], ["sin32"], to=float32),
        node("Gather", ["cos32", "pos"], ["cos_t"], axis=0),
        node("Gather", ["sin32", "pos"], ["sin_t"], axis=0),
        node("Unsqueeze", ["cos_t", "rows_axis"], ["cos"]),
        node("Unsqueeze", ["sin_t", "rows_axis"], ["sin"]),
    ]
    for name, heads in (("q", "heads"), ("k", "kv_heads")):  # half-split rotation of each head
        nodes += [
            node("Concat", ["minus_one", heads, "head_dim"], [f"{name}_shape"], axis=0),
            node("Reshape", [name, f"{name}_shape"], [f"{name}3"]),
            node("Split", [f"{name}3"], [f"{name}1", f"{name}2"], axis=2, num_outputs=2),
            node("Mul", [f"{name}1", "cos"], [f"{name}1c"]),
            node("Mul", [f"{name}2", "sin"], [f"{name}2s"]),
            node("Mul", [f"{name}2", "cos"], [f"{name}2c"]),
            node("Mul", [f"{name}1", "sin"], [f"{name}1s"]),
            node("Sub", [f"{name}1c", f"{name}2s"], [f"{name}r1"]),
            node("Add", [f"{name}2c", f"{name}1s"], [f"{name}r2"]),
            node("Concat", [f"{name}r1", f"{name}r2"], [f"{name}_rot"], axis=2),
        ]
    nodes += [
        # each token's cache slot: its row's page for its position, and the offset in it
        node("Div", ["pos", "page_s"], ["page_index"]),
        node("Mod", ["pos", "page_s"], ["page_offset"]),
        node("Cast", ["token_rows"], ["rows"], to=int64),
        node("Unsqueeze", ["rows", "rows_axis"], ["rows2"]),
        node("Unsqueeze", ["page_index", "rows_axis"], ["page_index2"]),
        node("Concat", ["rows2", "page_index2"], ["table_index"], axis=1),
        node("Cast", ["page_table"], ["table"], to=int64),
        node("GatherND", ["table", "table_index"], ["page"]),
        node("Mul", ["page", "page_s"], ["page_start"]),
        node("Add", ["page_start", "page_offset"], ["slot"]),
        node("Unsqueeze", ["slot", "rows_axis"], ["slot2"]),
        node("CastLike", ["k_rot", "key_cache"], ["k_stored"]),
        node("Concat", ["minus_one", "kv_heads", "head_dim"], ["v_shape"], axis=0),
        node("Reshape", ["v", "v_shape"], ["v3"]),
        node("CastLike", ["v3", "value_cache"], ["v_stored"]),
        node("ScatterND", ["key_cache", "slot2", "k_stored"], ["present_key"]),
        node("ScatterND", ["value_cache", "slot2", "v_stored"], ["present_value"]),
        # each token's row's slots, position by position: [T, L]
        node("Range", ["zero_s", "page_s", "one_s"], ["in_page"]),
        node("Unsqueeze", ["table", "two"], ["table3"]),
        node("Mul", ["table3", "page_s"], ["table_start"]),
        node("Add", ["table_start", "in_page"], ["row_slots3"]),
        node("Concat", ["zero", "minus_one"], ["flat_rows"], axis=0),
        node("Reshape", ["row_slots3", "flat_rows"], ["row_slots"]),
        node("Gather", ["row_slots", "rows"], ["token_slots"], axis=0),
        node("Gather", ["present_key", "token_slots"], ["keys_t"], axis=0),
        node("Gather", ["present_value", "token_slots"], ["values_t"], axis=0),
        node("Cast", ["keys_t"], ["keys"], to=float32),
        node("Cast", ["values_t"], ["values"], to=float32),
        # scores [T, Hkv, G, L] of the rotated, scaled queries grouped by KV head
        node("Concat", ["minus_one", "kv_heads", "group", "head_dim"], ["q4_shape"], axis=0),
        node("Reshape", ["q_rot", "q4_shape"], ["q4"]),
        node("Mul", ["q4", "scale"], ["q_scaled"]),
        node("Transpose", ["keys"], ["keys_t4"], perm=[0, 2, 3, 1]),
        node("MatMul", ["q_scaled", "keys_t4"], ["scores"]),
        # key l is seen by a token at p iff p - window < l <= p
        node("Shape", ["token_slots"], ["slots_shape"]),
        node("Slice", ["slots_shape", "one", "two"], ["span1"]),
        node("Squeeze", ["span1"], ["span"]),
        node("Range", ["zero_s", "span", "one_s"], ["key_index"]),
        node("Unsqueeze", ["pos", "rows_axis"], ["pos2"]),
        node("LessOrEqual", ["key_index", "pos2"], ["causal"]),
        node("Greater", ["window_s", "zero_s"], ["windowed"]),
        node("Where", ["windowed", "window_s", "no_window"], ["window"]),
        node("Sub", ["pos2", "window"], ["lowest"]),
        node("Greater", ["key_index", "lowest"], ["recent"]),
        node("And", ["causal", "recent"], ["seen2"]),
        node("Concat", ["one", "two"], ["head_axes"], axis=0),
        node("Unsqueeze", ["seen2", "head_axes"], ["seen"]),
        node("Where", ["seen", "scores", "masked"], ["seen_scores"]),
        # the sink as one more logit per head, dropped after the softmax
        node("Cast", ["sinks"], ["sinks32"], to=float32),
        node("Concat", ["one", "kv_heads", "group", "one"], ["sink_shape"], axis=0),
        node("Reshape", ["sinks32", "sink_shape"], ["sinks4"]),
        node("Shape", ["seen_scores"], ["scores_shape"]),
        node("Slice", ["scores_shape", "zero", "three"], ["scores_lead"]),
        node("Concat", ["scores_lead", "one"], ["sink_full_shape"], axis=0),
        node("Expand", ["sinks4", "sink_full_shape"], ["sink_column"]),
        node("Concat", ["seen_scores", "sink_column"], ["with_sink"], axis=3),
        node("Softmax", ["with_sink"], ["probabilities"], axis=3),
        node("Slice", ["probabilities", "zero", "span1", "three"], ["weights"]),
        node("Transpose", ["values"], ["values_t4"], perm=[0, 2, 1, 3]),
        node("MatMul", ["weights", "values_t4"], ["attended"]),
        node("Concat", ["minus_one", "q_width"], ["out_shape"], axis=0),
        node("Reshape", ["attended", "out_shape"], ["out32"]),
        node("CastLike", ["out32", "qkv"], ["out"]),
    ]
    return helper.make_function(
        ENGINE_DOMAIN,
        "PagedAttention",
        INPUTS,
        ["out", "present_key", "present_value"],
        nodes,
        [helper.make_opsetid("", OPSET)],
        attributes=list(ATTRIBUTES),
    )
