"""The gpt-oss decoder as an ONNX graph, built from a checkpoint.

One graph serves prefill and decode: token ids [B, S] in, last-position logits [B, V] out. Each layer's
KV cache is a [B, kv_heads, max_positions, head_dim] buffer bound as both past and present (updated in
place). Attention is GroupQueryAttention with the sinks as `head_sink`, a 128-token window on even
layers and YaRN rotary tables. Each MoE is one node of the custom-domain op `MXFP4MoE`, a model-local
function whose body is this provider's realization (on CPU: exact MXFP4 dequantization by
GatherBlockQuantized of the experts the step's tokens route to, at every run, then the contrib MoE
with the interleaved clamped SwiGLU).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .checkpoint import Checkpoint
from .config import ModelConfig
from .rope import cos_sin

BUILDER_VERSION = "3"
OPSET = 23  # RMSNormalization
IR_VERSION = 11  # FLOAT4E2M1 needs 11; onnxruntime 1.31 loads up to 13
ENGINE_DOMAIN = "gptoss.engine"
MS_DOMAIN = "com.microsoft"
RMS_EPSILON = 1e-5
SWIGLU_ALPHA = 1.702


@dataclass(frozen=True, slots=True)
class GraphOptions:
    max_positions: int  # KV capacity per sequence (and the rotary table length)


def kv_names(layer: int) -> tuple[str, str, str, str]:
    return f"past_key_{layer}", f"past_value_{layer}", f"present_key_{layer}", f"present_value_{layer}"


def _moe_function(config: ModelConfig) -> onnx.FunctionProto:
    """`MXFP4MoE(x [T,H], router_logits [T,E], w1, s1, b1, w2, s2, b2) -> [T,H]`, realized for CPU.

    Only the experts some token routes to are dequantized (at decode, k per sequence instead of all E):
    their weights, biases and router columns are gathered, and each token's top-k among them is its
    top-k among all experts, so the result is the same.
    """
    top_k = numpy_helper.from_array(np.array([config.experts_per_token], dtype=np.int64))
    flat = numpy_helper.from_array(np.array([-1], dtype=np.int64))
    dequant = {"domain": MS_DOMAIN, "gather_axis": 0, "quantize_axis": 2, "block_size": 32}
    nodes = [
        helper.make_node("Constant", [], ["k"], value=top_k),
        helper.make_node("Constant", [], ["flat"], value=flat),
        helper.make_node("TopK", ["router_logits", "k"], ["top_values", "top_experts"], axis=-1),
        helper.make_node("Reshape", ["top_experts", "flat"], ["routed"]),
        helper.make_node("Unique", ["routed"], ["used"], sorted=1),
        helper.make_node("GatherBlockQuantized", ["w1", "used", "s1"], ["fc1"], **dequant),
        helper.make_node("GatherBlockQuantized", ["w2", "used", "s2"], ["fc2"], **dequant),
        helper.make_node("Gather", ["b1", "used"], ["fc1_bias"], axis=0),
        helper.make_node("Gather", ["b2", "used"], ["fc2_bias"], axis=0),
        helper.make_node("Gather", ["router_logits", "used"], ["used_logits"], axis=1),
        helper.make_node(
            "MoE",
            ["x", "used_logits", "fc1", "fc1_bias", "fc2", "fc2_bias"],
            ["y"],
            domain=MS_DOMAIN,
            k=config.experts_per_token,
            activation_type="swiglu",
            swiglu_fusion=1,  # gate and linear rows interleaved, as gpt-oss stores them
            swiglu_limit=config.swiglu_limit,
            activation_alpha=SWIGLU_ALPHA,
            activation_beta=1.0,
            normalize_routing_weights=1,  # softmax over the top-k logits only
        ),
    ]
    return helper.make_function(
        ENGINE_DOMAIN,
        "MXFP4MoE",
        ["x", "router_logits", "w1", "s1", "b1", "w2", "s2", "b2"],
        ["y"],
        nodes,
        [helper.make_opsetid("", OPSET), helper.make_opsetid(MS_DOMAIN, 1)],
        attributes=list(moe_attributes(config)),  # read by compiled kernels; the body has them built in
    )


def moe_attributes(config: ModelConfig) -> dict[str, float | int]:
    """What a compiled MXFP4MoE kernel reads from its node."""
    return {"k": config.experts_per_token, "swiglu_limit": config.swiglu_limit, "activation_alpha": SWIGLU_ALPHA}


class _Builder:
    def __init__(self, checkpoint: Checkpoint, options: GraphOptions) -> None:
        self.checkpoint = checkpoint
        self.config = checkpoint.config
        self.options = options
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []

    def weight(self, name: str, array: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def fp32(self, name: str, transpose: bool = False) -> str:
        array = self.checkpoint.float32(name)
        return self.weight(name, array.T if transpose else array)

    def mxfp4(self, name: str) -> tuple[str, str]:
        codes, scales = mxfp4_initializers(
            name, self.checkpoint.tensor(name + ".blocks"), self.checkpoint.tensor(name + ".scales")
        )
        self.initializers += [codes, scales]
        return codes.name, scales.name

    def node(self, op: str, inputs: list[str], outputs: list[str], **attributes: object) -> str:
        domain = attributes.pop("domain", "")
        self.nodes.append(helper.make_node(op, inputs, outputs, domain=domain, **attributes))
        return outputs[0]

    def rms_norm(self, x: str, scale_name: str, out: str) -> str:
        return self.node("RMSNormalization", [x, self.fp32(scale_name)], [out], axis=-1, epsilon=RMS_EPSILON)

    def layer(self, n: int, x: str) -> str:
        c = self.config
        b = f"block.{n}."
        h = self.rms_norm(x, b + "attn.norm.scale", f"l{n}_attn_in")
        qkv = self.node("MatMul", [h, self.fp32(b + "attn.qkv.weight", transpose=True)], [f"l{n}_qkv_mm"])
        qkv = self.node("Add", [qkv, self.fp32(b + "attn.qkv.bias")], [f"l{n}_qkv"])
        q_width, kv_width = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
        split = self.weight(f"l{n}_split", np.array([q_width, kv_width, kv_width], dtype=np.int64))
        self.node("Split", [qkv, split], [f"l{n}_q", f"l{n}_k", f"l{n}_v"], axis=-1)
        past_k, past_v, present_k, present_v = kv_names(n)
        attention = self.node(
            "GroupQueryAttention",
            [
                f"l{n}_q",
                f"l{n}_k",
                f"l{n}_v",
                past_k,
                past_v,
                "seqlens_k",
                "total_sequence_length",
                "cos_cache",
                "sin_cache",
                "",
                "",
                self.fp32(b + "attn.sinks"),
            ],
            [f"l{n}_attn", present_k, present_v],
            domain=MS_DOMAIN,
            num_heads=c.num_attention_heads,
            kv_num_heads=c.num_key_value_heads,
            scale=1 / math.sqrt(c.head_dim),
            local_window_size=c.sliding_window if c.is_sliding(n) else -1,
            do_rotary=1,
            rotary_interleaved=0,
        )
        out = self.node("MatMul", [attention, self.fp32(b + "attn.out.weight", transpose=True)], [f"l{n}_o_mm"])
        out = self.node("Add", [out, self.fp32(b + "attn.out.bias")], [f"l{n}_o"])
        x = self.node("Add", [x, out], [f"l{n}_after_attn"])

        h = self.rms_norm(x, b + "mlp.norm.scale", f"l{n}_mlp_in")
        rows = self.node("Reshape", [h, "flat_hidden"], [f"l{n}_rows"])
        logits = self.node("MatMul", [rows, self.fp32(b + "mlp.gate.weight", transpose=True)], [f"l{n}_gate_mm"])
        logits = self.node("Add", [logits, self.fp32(b + "mlp.gate.bias")], [f"l{n}_router"])
        w1, s1 = self.mxfp4(b + "mlp.mlp1_weight")
        w2, s2 = self.mxfp4(b + "mlp.mlp2_weight")
        moe = self.node(
            "MXFP4MoE",
            [rows, logits, w1, s1, self.fp32(b + "mlp.mlp1_bias"), w2, s2, self.fp32(b + "mlp.mlp2_bias")],
            [f"l{n}_moe_rows"],
            domain=ENGINE_DOMAIN,
            **moe_attributes(self.config),
        )
        moe = self.node("Reshape", [moe, "hidden_shape"], [f"l{n}_moe"])
        return self.node("Add", [x, moe], [f"l{n}_out"])

    def build(self, progress: Callable[[int, int], None] | None) -> onnx.ModelProto:
        c, layers = self.config, self.config.num_hidden_layers
        cos, sin = cos_sin(c, self.options.max_positions)
        self.weight("cos_cache", cos)
        self.weight("sin_cache", sin)
        self.weight("flat_hidden", np.array([-1, c.hidden_size], dtype=np.int64))
        self.node("Shape", ["input_ids"], ["ids_shape"])
        self.weight("hidden_dim", np.array([c.hidden_size], dtype=np.int64))
        self.node("Concat", ["ids_shape", "hidden_dim"], ["hidden_shape"], axis=0)
        x = self.node("Gather", [self.fp32("embedding.weight"), "input_ids"], ["embedded"], axis=0)
        for n in range(layers):
            x = self.layer(n, x)
            if progress is not None:
                progress(n + 1, layers + 1)
        last = self.node(
            "Slice",
            [
                x,
                self.weight("last_start", np.array([-1], np.int64)),
                self.weight("last_end", np.array([2**62], np.int64)),
                self.weight("seq_axis", np.array([1], np.int64)),
            ],
            ["last_hidden"],
        )
        last = self.node("Squeeze", [last, "seq_axis"], ["last_squeezed"])
        normed = self.rms_norm(last, "norm.scale", "final_norm")
        self.node("MatMul", [normed, self.fp32("unembedding.weight", transpose=True)], ["logits"])
        if progress is not None:
            progress(layers + 1, layers + 1)
        return self._model()

    def _model(self) -> onnx.ModelProto:
        c = self.config
        kv_shape = ["batch", c.num_key_value_heads, self.options.max_positions, c.head_dim]
        inputs = [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
            helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["batch"]),
            helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, []),
        ]
        outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", c.vocab_size])]
        for n in range(c.num_hidden_layers):
            past_k, past_v, present_k, present_v = kv_names(n)
            inputs += [helper.make_tensor_value_info(name, TensorProto.FLOAT, kv_shape) for name in (past_k, past_v)]
            outputs += [
                helper.make_tensor_value_info(name, TensorProto.FLOAT, kv_shape) for name in (present_k, present_v)
            ]
        graph = helper.make_graph(self.nodes, "gpt_oss", inputs, outputs, self.initializers)
        return _model(graph, c)


def _model(graph: onnx.GraphProto, config: ModelConfig) -> onnx.ModelProto:
    opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid(MS_DOMAIN, 1), helper.make_opsetid(ENGINE_DOMAIN, 1)]
    model = helper.make_model(
        graph, opset_imports=opsets, functions=[_moe_function(config)], producer_name="gpt-oss-gateway"
    )
    model.ir_version = IR_VERSION
    return model


def mxfp4_initializers(name: str, blocks: np.ndarray, scales: np.ndarray) -> tuple[TensorProto, TensorProto]:
    """Checkpoint MXFP4 (blocks [E, N, K/32, 16] uint8, E8M0 scales [E, N, K/32]) as the MXFP4MoE inputs:
    the packed codes as a FLOAT4E2M1 tensor [E, N, K] and the scales as float [E, N, K/32]."""
    experts, rows, groups, _ = blocks.shape
    codes = helper.make_tensor(
        name + ".fp4", TensorProto.FLOAT4E2M1, [experts, rows, groups * 32], blocks.tobytes(), raw=True
    )
    factors = np.ldexp(np.float32(1), scales.astype(np.int32) - 127).astype(np.float32)
    return codes, numpy_helper.from_array(factors, name + ".scale_f32")


def moe_layer_model(config: ModelConfig, tensors: dict[str, np.ndarray]) -> onnx.ModelProto:
    """One MXFP4MoE node (x [T, H], router_logits [T, E] in; y out) over one layer's checkpoint tensors
    (`mlp1_weight.blocks`/`.scales`, `mlp1_bias`, the same for mlp2): to check and time realizations."""
    initializers: list[TensorProto] = []
    inputs = ["x", "router_logits"]
    for fc in ("mlp1", "mlp2"):
        codes, scales = mxfp4_initializers(fc, tensors[f"{fc}_weight.blocks"], tensors[f"{fc}_weight.scales"])
        bias = numpy_helper.from_array(tensors[f"{fc}_bias"].astype(np.float32), fc + ".bias")
        initializers += [codes, scales, bias]
        inputs += [codes.name, scales.name, bias.name]
    node = helper.make_node("MXFP4MoE", inputs, ["y"], domain=ENGINE_DOMAIN, **moe_attributes(config))
    graph = helper.make_graph(
        [node],
        "mxfp4_moe",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["tokens", config.hidden_size]),
            helper.make_tensor_value_info("router_logits", TensorProto.FLOAT, ["tokens", config.num_experts]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["tokens", config.hidden_size])],
        initializers,
    )
    return _model(graph, config)


def build_model(
    checkpoint: Checkpoint, options: GraphOptions, progress: Callable[[int, int], None] | None = None
) -> onnx.ModelProto:
    return _Builder(checkpoint, options).build(progress)
