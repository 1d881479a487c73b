"""The gpt-oss decoder as an ONNX graph, built from a checkpoint and written tensor by tensor to disk.

One graph serves prefill and decode, over ragged steps: the step's token ids [T] in (each with its row and
position), each row's last-token logits [B, V] (float32) out. Each layer's KV cache is a pool of pages
[pages x page_size, kv_heads, head_dim] bound as both past and present (updated in place): full-attention
layers read it through the rows' `full_pages` tables, sliding-window layers through `window_pages` (their
own, smaller pool: a row keeps only the pages its window reaches). Attention is the custom-domain op
`PagedAttention` (attention.py) on the packed qkv, with the sinks, a 128-token window on even layers and YaRN
rotary tables; each residual add is fused with the next RMSNorm
(SkipSimplifiedLayerNormalization). Activations, non-expert weights and the KV cache are in the graph's
dtype (float32, float16 or bfloat16); in a float32 graph the dense weights (projections, router, unembedding)
that the checkpoint holds in bf16 stay bf16, as the custom-domain op `DenseBF16` (a model-local function:
widened once at load and a MatMul, unless a compiled kernel reads the 16 bits each step). Each MoE is one
node of the custom-domain op `MXFP4MoE` over the
checkpoint's own bytes (FLOAT4E2M1 codes, 1-byte E8M0 scales): a model-local function whose body is the
portable realization (exact MXFP4 dequantization by GatherBlockQuantized of the experts the step's tokens
route to, then the contrib MoE with the interleaved clamped SwiGLU, in float32); a compiled kernel
registered for the domain takes precedence. With `moe` qmoe, each MoE is ONNX Runtime's contrib QMoE (fp4)
over the same bytes instead (backends/engine/qmoe.py; CUDA only).

Initializers never sit in one protobuf message: each is written to the external data file as it is
made (and dropped), so neither protobuf's 2 GiB limit nor the host's memory caps the model. The experts'
codes and scales are not copied at all where the checkpoint's files can be hard-linked beside the graph
(the same file system, files the converting user may link): the graph reads them in place, so a model's
experts take their disk space once (gpt-oss-120b: about 57 GiB less).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .attention import attention_attributes, paged_attention_function
from .checkpoint import Checkpoint
from .config import SWIGLU_ALPHA, ModelConfig
from .opsets import ENGINE_DOMAIN, IR_VERSION, OPSET
from .qmoe import MS_DOMAIN, MoeRealization, qmoe_node, qmoe_weights
from .rope import cos_sin

BUILDER_VERSION = "9"
RMS_EPSILON = 1e-5
INLINE_BYTES = 1024
STREAM_BLOCK_BYTES = 32 * 1024 * 1024  # a large weight is converted and written in blocks of this size
DATA_ALIGNMENT = 4096  # each tensor's offset in the data file (page-aligned: ONNX Runtime can map it)

Dtype = Literal["float32", "float16", "bfloat16"]
BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES: dict[str, tuple[int, np.dtype]] = {
    "float32": (TensorProto.FLOAT, np.dtype(np.float32)),
    "float16": (TensorProto.FLOAT16, np.dtype(np.float16)),
    "bfloat16": (TensorProto.BFLOAT16, np.dtype(ml_dtypes.bfloat16)),
}


@dataclass(frozen=True, slots=True)
class GraphOptions:
    max_positions: int  # positions a sequence may reach (the rotary table length)
    dtype: Dtype = "float32"  # activations, non-expert weights, KV cache
    moe: MoeRealization = "mxfp4moe"  # each MoE as our MXFP4MoE op, or as ONNX Runtime's QMoE (CUDA only)
    # float32 graphs: bf16 dense weights kept in bf16 for DenseBF16, a CPU op (else float32 copies for MatMul)
    dense_bf16: bool = True
    # with dense_bf16: the attention projections and the unembedding in int8, a scale per row (DenseInt8); the
    # router stays bf16 (its logits pick the experts)
    dense_int8: bool = False
    # the MoE kernel's decode path (and its prefill's integer tiles, in x86 builds with AVX2) on activations
    # quantized per 32 values in this many int8 pieces (1 or 2; the `int8_activations` attribute), 0: float
    moe_int8_pieces: int = 0
    page_size: int = 32  # positions per KV page

    @property
    def onnx_type(self) -> int:
        return DTYPES[self.dtype][0]

    @property
    def numpy_type(self) -> np.dtype:
        return DTYPES[self.dtype][1]


def kv_names(layer: int) -> tuple[str, str, str, str]:
    return f"past_key_{layer}", f"past_value_{layer}", f"present_key_{layer}", f"present_value_{layer}"


STEP_INPUTS = ("input_ids", "positions", "token_rows", "full_pages", "window_pages", "last_tokens")


class TensorWriter:
    """Initializers written straight to an external data file; each TensorProto keeps only the reference."""

    def __init__(self, data_path: Path) -> None:
        self.location = data_path.name
        self._directory = data_path.parent
        self._file: BinaryIO = data_path.open("wb")
        self._offset = 0

    def tensor(self, name: str, onnx_type: int, shape: tuple[int, ...] | list[int], data: np.ndarray) -> TensorProto:
        """`data`'s bytes as tensor `name` (of `onnx_type` and `shape`), appended at an aligned offset."""
        payload = memoryview(np.ascontiguousarray(data).view(np.uint8).reshape(-1))
        padding = -self._offset % DATA_ALIGNMENT
        self._file.write(b"\0" * padding)
        self._offset += padding
        proto = TensorProto(name=name, data_type=onnx_type, dims=list(shape))
        proto.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.location), ("offset", self._offset), ("length", payload.nbytes)):
            entry = proto.external_data.add()
            entry.key, entry.value = key, str(value)
        self._file.write(payload)
        self._offset += payload.nbytes
        return proto

    def linked(
        self, name: str, onnx_type: int, shape: list[int], source: tuple[Path, int, int] | None
    ) -> TensorProto | None:
        """Tensor `name` as the bytes `source` (file, offset, length) already holds, read from a hard link to that
        file beside the data file (ONNX Runtime refuses data outside the model's directory, symbolic links
        included): no copy written. None where the file cannot be linked here (another file system)."""
        if source is None:
            return None
        file, offset, length = source
        link = self._directory / f"linked-{hashlib.sha256(str(file.resolve()).encode()).hexdigest()[:12]}-{file.name}"
        if not link.exists():
            try:
                os.link(file, link)
            except OSError:
                return None
        proto = TensorProto(name=name, data_type=onnx_type, dims=shape)
        proto.data_location = TensorProto.EXTERNAL
        for key, value in (("location", link.name), ("offset", offset), ("length", length)):
            entry = proto.external_data.add()
            entry.key, entry.value = key, str(value)
        return proto

    def converted(self, name: str, matrix: np.ndarray, dtype: np.dtype, transpose: bool) -> TensorProto:
        """`matrix` (or its transpose) in `dtype`, converted and written a block of rows at a time: memory
        holds one block (about STREAM_BLOCK_BYTES), never a converted or transposed copy of the matrix."""
        out = matrix.T if transpose else matrix
        rows, row_bytes = out.shape[0], int(np.prod(out.shape[1:], dtype=np.int64)) * np.dtype(dtype).itemsize
        padding = -self._offset % DATA_ALIGNMENT
        self._file.write(b"\0" * padding)
        self._offset += padding
        proto = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), dims=out.shape)
        proto.data_location = TensorProto.EXTERNAL
        step = max(1, STREAM_BLOCK_BYTES // max(1, row_bytes))
        for start in range(0, rows, step):
            block = out[start : start + step].astype(np.float32).astype(dtype, copy=False)
            self._file.write(memoryview(np.ascontiguousarray(block).view(np.uint8).reshape(-1)))
        length = rows * row_bytes
        for key, value in (("location", self.location), ("offset", self._offset), ("length", length)):
            entry = proto.external_data.add()
            entry.key, entry.value = key, str(value)
        self._offset += length
        return proto

    def array(self, name: str, array: np.ndarray) -> TensorProto:
        """A NumPy array as tensor `name`; small ones (shapes, indices: shape inference reads them) inline."""
        if array.nbytes <= INLINE_BYTES:
            return numpy_helper.from_array(np.ascontiguousarray(array), name)
        onnx_type = helper.np_dtype_to_tensor_dtype(array.dtype)
        return self.tensor(name, onnx_type, array.shape, array)

    def close(self) -> None:
        self._file.close()


def _moe_function(config: ModelConfig, options: GraphOptions) -> onnx.FunctionProto:
    """`MXFP4MoE(x [..., H], router_logits [..., E], w1, s1, b1, w2, s2, b2) -> [..., H]`, portable realization.

    Only the experts some token routes to are dequantized (at decode, k per sequence instead of all E):
    their weights, biases and router columns are gathered, and each token's top-k among them is its
    top-k among all experts, so the result is the same. The arithmetic is float32 whatever the dtype.
    """
    constant = helper.make_tensor
    dequant = {"domain": MS_DOMAIN, "gather_axis": 0, "quantize_axis": 2, "block_size": 32}
    float32 = TensorProto.FLOAT
    nodes = [
        helper.make_node(
            "Constant", [], ["k"], value=constant("k", TensorProto.INT64, [1], [config.experts_per_token])
        ),
        helper.make_node("Constant", [], ["flat"], value=constant("flat", TensorProto.INT64, [1], [-1])),
        helper.make_node("Constant", [], ["two"], value=constant("two", float32, [], [2.0])),
        helper.make_node("Constant", [], ["bias"], value=constant("bias", float32, [], [127.0])),
        helper.make_node(
            "Constant", [], ["rows"], value=constant("rows", TensorProto.INT64, [2], [-1, config.hidden_size])
        ),
        helper.make_node(
            "Constant", [], ["logit_rows"], value=constant("lr", TensorProto.INT64, [2], [-1, config.num_experts])
        ),
        helper.make_node("Shape", ["x"], ["x_shape"]),
        helper.make_node("Reshape", ["x", "rows"], ["x_rows"]),
        helper.make_node("Cast", ["x_rows"], ["x32"], to=float32),
        helper.make_node("Reshape", ["router_logits", "logit_rows"], ["logit_rows_t"]),
        helper.make_node("Cast", ["logit_rows_t"], ["logits32"], to=float32),
        helper.make_node("TopK", ["logits32", "k"], ["top_values", "top_experts"], axis=-1),
        helper.make_node("Reshape", ["top_experts", "flat"], ["routed"]),
        helper.make_node("Unique", ["routed"], ["used"], sorted=1),
    ]
    for fc in ("1", "2"):  # E8M0 exponents to float factors, then the gathered experts dequantized
        nodes += [
            helper.make_node("Cast", [f"s{fc}"], [f"s{fc}_f"], to=float32),
            helper.make_node("Sub", [f"s{fc}_f", "bias"], [f"s{fc}_exp"]),
            helper.make_node("Pow", ["two", f"s{fc}_exp"], [f"s{fc}_scale"]),
            helper.make_node("GatherBlockQuantized", [f"w{fc}", "used", f"s{fc}_scale"], [f"fc{fc}"], **dequant),
            helper.make_node("Cast", [f"b{fc}"], [f"b{fc}_f"], to=float32),
            helper.make_node("Gather", [f"b{fc}_f", "used"], [f"fc{fc}_bias"], axis=0),
        ]
    nodes += [
        helper.make_node("Gather", ["logits32", "used"], ["used_logits"], axis=1),
        helper.make_node(
            "MoE",
            ["x32", "used_logits", "fc1", "fc1_bias", "fc2", "fc2_bias"],
            ["y32"],
            domain=MS_DOMAIN,
            k=config.experts_per_token,
            activation_type="swiglu",
            swiglu_fusion=1,  # gate and linear rows interleaved, as gpt-oss stores them
            swiglu_limit=config.swiglu_limit,
            activation_alpha=SWIGLU_ALPHA,
            activation_beta=1.0,
            normalize_routing_weights=1,  # softmax over the top-k logits only
        ),
        helper.make_node("Cast", ["y32"], ["y_rows"], to=options.onnx_type),
        helper.make_node("Reshape", ["y_rows", "x_shape"], ["y"]),
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


def dense_bf16_function() -> onnx.FunctionProto:
    """`DenseBF16(x [..., K] float, w [N, K] bfloat16) -> x . w^T [..., N]`, portable realization (the weight
    widened to float once, at load): what the compiled kernel computes, reading the 16 bits each step."""
    nodes = [
        helper.make_node("Cast", ["w"], ["w32"], to=TensorProto.FLOAT),
        helper.make_node("Transpose", ["w32"], ["wt"], perm=[1, 0]),
        helper.make_node("MatMul", ["x", "wt"], ["y"]),
    ]
    return helper.make_function(ENGINE_DOMAIN, "DenseBF16", ["x", "w"], ["y"], nodes, [helper.make_opsetid("", OPSET)])


def dense_int8_function() -> onnx.FunctionProto:
    """`DenseInt8(x [..., K] float, w [N, K] int8, scale [N] float) -> (x . w^T) * scale`, portable realization
    (the weight widened to float once, at load): what the compiled kernel computes, reading the 8 bits each step."""
    nodes = [
        helper.make_node("Cast", ["w"], ["w32"], to=TensorProto.FLOAT),
        helper.make_node("Transpose", ["w32"], ["wt"], perm=[1, 0]),
        helper.make_node("MatMul", ["x", "wt"], ["products"]),
        helper.make_node("Mul", ["products", "scale"], ["y"]),
    ]
    opsets = [helper.make_opsetid("", OPSET)]
    return helper.make_function(ENGINE_DOMAIN, "DenseInt8", ["x", "w", "scale"], ["y"], nodes, opsets)


def int8_rows(weight: np.ndarray, block_rows: int = 8192) -> tuple[np.ndarray, np.ndarray]:
    """A weight [N, K] as int8 with a float scale per row: q = round(w / s), s = max |w| of the row / 127 (1 for
    a row of zeros), so q lies in [-127, 127] and each value is within s / 2 of its original. Taken in blocks
    of rows (the unembedding is 579 M values)."""
    rows = weight.shape[0]
    codes = np.empty(weight.shape, np.int8)
    scales = np.empty(rows, np.float32)
    for start in range(0, rows, block_rows):
        block = weight[start : start + block_rows].astype(np.float64)
        peak = np.abs(block).max(axis=1)
        scale = np.where(peak > 0, peak / 127, 1).astype(np.float32)
        codes[start : start + block_rows] = np.clip(np.rint(block / scale[:, None]), -127, 127)  # by the scale as kept
        scales[start : start + block_rows] = scale
    return codes, scales


def moe_attributes(config: ModelConfig, int8_activations: int = 0) -> dict[str, float | int]:
    """What a compiled MXFP4MoE kernel reads from its node (`int8_activations`, the int8 pieces of its decode
    path's activations and its prefill's integer tiles', 0 for float: the CPU kernel's alone; the function body and
    the CUDA kernels compute in float whatever it says)."""
    return {
        "k": config.experts_per_token,
        "swiglu_limit": config.swiglu_limit,
        "activation_alpha": SWIGLU_ALPHA,
        "int8_activations": int(int8_activations),
    }


class _Builder:
    def __init__(self, checkpoint: Checkpoint, options: GraphOptions, writer: TensorWriter) -> None:
        self.checkpoint = checkpoint
        self.config = checkpoint.config
        self.options = options
        self.writer = writer
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []

    def weight(self, name: str, array: np.ndarray) -> str:
        self.initializers.append(self.writer.array(name, array))
        return name

    def dense(self, x: str, name: str, out: str) -> str:
        """x . W^T for a dense weight W [N, K]. In a float32 graph a bf16 checkpoint weight stays bf16 and goes
        through DenseBF16 (widened exactly as read: half the bytes of a float32 copy per step); otherwise it is
        stored transposed in the graph's dtype for a MatMul."""
        array = self.checkpoint.tensor(name)
        if not self._keeps_bf16(array):
            return self.node("MatMul", [x, self._as_stored(name, array, transpose=True)], [out])
        if self.options.dense_int8 and not name.endswith("mlp.gate.weight"):
            codes, scales = int8_rows(array)
            inputs = [x, self.weight(name, codes), self.weight(name + ".scale", scales)]
            return self.node("DenseInt8", inputs, [out], domain=ENGINE_DOMAIN)
        return self.node("DenseBF16", [x, self._kept_bf16(name, array)], [out], domain=ENGINE_DOMAIN)

    def embed(self, ids: str, out: str) -> str:
        """The embedding's rows of `ids`. In a float32 graph a bf16 checkpoint table stays bf16 and only the rows
        gathered are widened: a float32 copy would double its bytes in memory (2.3 GB at gpt-oss's vocabulary)."""
        name = "embedding.weight"
        array = self.checkpoint.tensor(name)
        if not self._keeps_bf16(array):
            return self.node("Gather", [self.stored(name), ids], [out], axis=0)
        rows = self.node("Gather", [self._kept_bf16(name, array), ids], [out + "_bf16"], axis=0)
        return self.node("Cast", [rows], [out], to=TensorProto.FLOAT)

    def _keeps_bf16(self, array: np.ndarray) -> bool:
        """Whether a checkpoint tensor stays bf16 in the graph: a bf16 one, in a float32 graph with dense_bf16."""
        return self.options.dtype == "float32" and array.dtype == BF16 and self.options.dense_bf16

    def _kept_bf16(self, name: str, array: np.ndarray) -> str:
        """A bf16 checkpoint tensor as the checkpoint holds it: its own bytes where the file can be linked (no
        copy), else written to the graph's data file."""
        linked = self.writer.linked(name, TensorProto.BFLOAT16, list(array.shape), self.checkpoint.location(name))
        if linked is None:
            return self._as_stored(name, array, dtype=BF16)
        self.initializers.append(linked)
        return name

    def stored(self, name: str, transpose: bool = False) -> str:
        """A checkpoint tensor in the graph's dtype (bf16 → float32 and float16 exactly or rounded once);
        large ones are converted and transposed block by block as they are written."""
        return self._as_stored(name, self.checkpoint.tensor(name), transpose)

    def _as_stored(self, name: str, array: np.ndarray, transpose: bool = False, dtype: np.dtype | None = None) -> str:
        dtype = dtype or self.options.numpy_type
        if array.nbytes > STREAM_BLOCK_BYTES and array.ndim == 2:
            self.initializers.append(self.writer.converted(name, array, dtype, transpose))
            return name
        if array.dtype != dtype:
            array = array.astype(np.float32).astype(dtype, copy=False)
        return self.weight(name, array.T if transpose else array)

    def mxfp4(self, name: str) -> tuple[str, str]:
        checkpoint = self.checkpoint
        blocks, scales_name = name + ".blocks", name + ".scales"
        experts, rows, groups, _ = checkpoint.shape(blocks)
        codes = self.writer.linked(
            name + ".fp4", TensorProto.FLOAT4E2M1, [experts, rows, groups * 32], checkpoint.location(blocks)
        )
        scales = self.writer.linked(
            name + ".e8m0", TensorProto.UINT8, [experts, rows, groups], checkpoint.location(scales_name)
        )
        if codes is None or scales is None:
            codes, scales = mxfp4_initializers(
                self.writer, name, checkpoint.tensor(blocks), checkpoint.tensor(scales_name)
            )
        self.initializers += [codes, scales]
        return codes.name, scales.name

    def node(self, op: str, inputs: list[str], outputs: list[str], **attributes: object) -> str:
        domain = attributes.pop("domain", "")
        self.nodes.append(helper.make_node(op, inputs, outputs, domain=domain, **attributes))
        return outputs[0]

    def norm(
        self, x: str, scale_name: str, out: str, residual: str | None = None, bias: str | None = None
    ) -> tuple[str, str]:
        """RMSNorm of x (+ residual and bias when given, fused): (normed, the residual stream after the add)."""
        scale = self.stored(scale_name)
        if residual is None:
            self.node("SimplifiedLayerNormalization", [x, scale], [out], axis=-1, epsilon=RMS_EPSILON, stash_type=1)
            return out, x
        total = out + "_residual"
        self.node(
            "SkipSimplifiedLayerNormalization",
            [x, residual, scale, *([bias] if bias else [])],
            [out, "", "", total],
            domain=MS_DOMAIN,
            epsilon=RMS_EPSILON,
        )
        return out, total

    def product(self, x: str, name: str, out: str) -> str:
        return self.dense(x, name + ".weight", out + "_mm")

    def linear(self, x: str, name: str, out: str) -> str:
        return self.node("Add", [self.product(x, name, out), self.stored(name + ".bias")], [out])

    def layer(self, n: int, x: str, residual: str | None) -> tuple[str, str]:
        """One block: (its MoE output, the residual stream it is to be added to)."""
        c = self.config
        b = f"block.{n}."
        h, residual = self.norm(x, b + "attn.norm.scale", f"l{n}_attn_in", residual)
        qkv = self.linear(h, b + "attn.qkv", f"l{n}_qkv")
        past_k, past_v, present_k, present_v = kv_names(n)
        table = "window_pages" if c.is_sliding(n) else "full_pages"
        inputs = [qkv, past_k, past_v, "positions", "token_rows", table, "cos_cache", "sin_cache"]
        attention = self.node(
            "PagedAttention",
            [*inputs, self.stored(b + "attn.sinks")],
            [f"l{n}_attn", present_k, present_v],
            domain=ENGINE_DOMAIN,
            **attention_attributes(c, n, self.options.page_size),
        )
        # the output projection's bias is added by the norm, with the residual: one node fewer per layer
        out = self.product(attention, b + "attn.out", f"l{n}_o")
        h, residual = self.norm(out, b + "mlp.norm.scale", f"l{n}_mlp_in", residual, self.stored(b + "attn.out.bias"))
        logits = self.linear(h, b + "mlp.gate", f"l{n}_router")
        moe = self.qmoe if self.options.moe == "qmoe" else self.mxfp4moe
        return moe(b + "mlp.", h, logits, f"l{n}_moe"), residual

    def mxfp4moe(self, prefix: str, h: str, logits: str, out: str) -> str:
        """A layer's MoE as one MXFP4MoE node (our compiled kernel, else the graph's function body)."""
        w1, s1 = self.mxfp4(prefix + "mlp1_weight")
        w2, s2 = self.mxfp4(prefix + "mlp2_weight")
        b1, b2 = self.stored(prefix + "mlp1_bias"), self.stored(prefix + "mlp2_bias")
        return self.node(
            "MXFP4MoE",
            [h, logits, w1, s1, b1, w2, s2, b2],
            [out],
            domain=ENGINE_DOMAIN,
            **moe_attributes(self.config, self.options.moe_int8_pieces),
        )

    def qmoe(self, prefix: str, h: str, logits: str, out: str) -> str:
        """A layer's MoE as ONNX Runtime's QMoE over the checkpoint's MXFP4 bytes."""
        projections = []
        for fc in ("mlp1", "mlp2"):
            name = prefix + fc + "_weight"
            codes, scales = qmoe_weights(
                name, self.checkpoint.tensor(name + ".blocks"), self.checkpoint.tensor(name + ".scales")
            )
            self.initializers += [self.writer.tensor(*codes), self.writer.tensor(*scales)]
            projections.append((codes[0], scales[0], self.stored(prefix + fc + "_bias")))
        rows = self.node("Reshape", [logits, "qmoe_router_rows"], [out + "_router_rows"])  # QMoE takes [T, E]
        scales = ("qmoe_global_scale", "qmoe_global_scale")
        self.nodes.append(qmoe_node(self.config, h, rows, projections[0], projections[1], scales, out))
        return out

    def build(self, progress: Callable[[int, int], None] | None) -> onnx.ModelProto:
        c, layers = self.config, self.config.num_hidden_layers
        cos, sin = cos_sin(c, self.options.max_positions)
        self.weight("cos_cache", cos.astype(self.options.numpy_type))
        self.weight("sin_cache", sin.astype(self.options.numpy_type))
        if self.options.moe == "qmoe":  # shared by every layer's QMoE
            self.weight("qmoe_router_rows", np.array([-1, c.num_experts], np.int64))
            self.weight("qmoe_global_scale", np.ones(c.num_experts, np.float32))
        x = self.embed("input_ids", "embedded")
        residual: str | None = None
        for n in range(layers):
            x, residual = self.layer(n, x, residual)
            if progress is not None:
                progress(n + 1, layers + 1)
        assert residual is not None
        last_moe = self.node("Gather", [x, "last_tokens"], ["last_moe"], axis=0)
        last_residual = self.node("Gather", [residual, "last_tokens"], ["last_residual"], axis=0)
        normed, _ = self.norm(last_moe, "norm.scale", "final_norm", last_residual)
        logits = self.dense(normed, "unembedding.weight", "logits_t")
        if self.options.dtype == "float32":
            self.node("Identity", [logits], ["logits"])
        else:
            self.node("Cast", [logits], ["logits"], to=TensorProto.FLOAT)
        if progress is not None:
            progress(layers + 1, layers + 1)
        return self.model_proto()

    def model_proto(self) -> onnx.ModelProto:
        c = self.config
        kv_type = self.options.onnx_type
        int32, int64 = TensorProto.INT32, TensorProto.INT64
        inputs = [
            helper.make_tensor_value_info("input_ids", int64, ["tokens"]),
            helper.make_tensor_value_info("positions", int32, ["tokens"]),
            helper.make_tensor_value_info("token_rows", int32, ["tokens"]),
            helper.make_tensor_value_info("full_pages", int32, ["rows", "pages"]),
            helper.make_tensor_value_info("window_pages", int32, ["rows", "pages"]),
            helper.make_tensor_value_info("last_tokens", int64, ["rows"]),
        ]
        outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["rows", c.vocab_size])]
        for n in range(c.num_hidden_layers):
            past_k, past_v, present_k, present_v = kv_names(n)
            slots = "window_slots" if c.is_sliding(n) else "full_slots"
            kv_shape = [slots, c.num_key_value_heads, c.head_dim]
            inputs += [helper.make_tensor_value_info(name, kv_type, kv_shape) for name in (past_k, past_v)]
            outputs += [helper.make_tensor_value_info(name, kv_type, kv_shape) for name in (present_k, present_v)]
        graph = helper.make_graph(self.nodes, "gpt_oss", inputs, outputs, self.initializers)
        return model_proto(graph, c, self.options)


def model_proto(graph: onnx.GraphProto, config: ModelConfig, options: GraphOptions) -> onnx.ModelProto:
    opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid(MS_DOMAIN, 1), helper.make_opsetid(ENGINE_DOMAIN, 1)]
    functions = [paged_attention_function()]
    if options.moe == "mxfp4moe":
        functions.append(_moe_function(config, options))
    if options.dtype == "float32" and options.dense_bf16:
        functions.append(dense_bf16_function())
        if options.dense_int8:
            functions.append(dense_int8_function())
    model = helper.make_model(graph, opset_imports=opsets, functions=functions, producer_name="gpt-oss-gateway")
    model.ir_version = IR_VERSION
    return model


def mxfp4_initializers(
    writer: TensorWriter, name: str, blocks: np.ndarray, scales: np.ndarray
) -> tuple[TensorProto, TensorProto]:
    """Checkpoint MXFP4 (blocks [E, N, K/32, 16] uint8, E8M0 scales [E, N, K/32] uint8) as the MXFP4MoE
    inputs, byte for byte: the packed codes as a FLOAT4E2M1 tensor [E, N, K] and the scales as uint8."""
    experts, rows, groups, _ = blocks.shape
    codes = writer.tensor(name + ".fp4", TensorProto.FLOAT4E2M1, [experts, rows, groups * 32], blocks)
    return codes, writer.tensor(name + ".e8m0", TensorProto.UINT8, scales.shape, scales)


def write_model(
    checkpoint: Checkpoint,
    options: GraphOptions,
    path: Path,
    progress: Callable[[int, int], None] | None = None,
) -> None:
    """The decoder graph at `path`, its weights in `path`.data."""
    writer = TensorWriter(path.with_name(path.name + ".data"))
    try:
        model = _Builder(checkpoint, options, writer).build(progress)
    finally:
        writer.close()
    path.write_bytes(model.SerializeToString())
