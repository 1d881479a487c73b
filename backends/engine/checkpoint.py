"""gpt-oss checkpoints in either layout, read memory-mapped through safetensors (no torch).

Tensors are addressed by their names in the original layout (`block.N.attn.qkv.weight`, ...); the
Hugging Face layout (`model.layers.N.self_attn.q_proj.weight`, ...) is mapped onto them, its separate
q/k/v projections joined. Every tensor's shape and dtype is checked against the config before use.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import ml_dtypes  # noqa: F401  (registers bfloat16 with NumPy, which safetensors' numpy reader needs)
import numpy as np
from safetensors import SafetensorError, safe_open

from .config import CheckpointError, ModelConfig

Layout = Literal["original", "hf"]
INDEX = "model.safetensors.index.json"


@dataclass(frozen=True, slots=True)
class Spec:
    shape: tuple[int, ...]
    dtype: str  # safetensors dtype name: BF16, U8, F32


# what a bf16 tensor may also be saved as (transformers keeps norms, biases and sinks in float32): exact
FLOAT_VARIANTS = ("BF16", "F16", "F32")
DEQUANTIZED_EXPERTS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")


def expected(config: ModelConfig) -> dict[str, Spec]:
    """Every tensor of the original layout with its shape and dtype."""
    c = config
    hidden, inner, experts = c.hidden_size, c.intermediate_size, c.num_experts
    specs = {
        "embedding.weight": Spec((c.vocab_size, hidden), "BF16"),
        "unembedding.weight": Spec((c.vocab_size, hidden), "BF16"),
        "norm.scale": Spec((hidden,), "BF16"),
    }
    for n in range(c.num_hidden_layers):
        b = f"block.{n}."
        specs.update(
            {
                b + "attn.norm.scale": Spec((hidden,), "BF16"),
                b + "attn.qkv.weight": Spec((c.qkv_rows, hidden), "BF16"),
                b + "attn.qkv.bias": Spec((c.qkv_rows,), "BF16"),
                b + "attn.sinks": Spec((c.num_attention_heads,), "BF16"),
                b + "attn.out.weight": Spec((hidden, c.num_attention_heads * c.head_dim), "BF16"),
                b + "attn.out.bias": Spec((hidden,), "BF16"),
                b + "mlp.norm.scale": Spec((hidden,), "BF16"),
                b + "mlp.gate.weight": Spec((experts, hidden), "BF16"),
                b + "mlp.gate.bias": Spec((experts,), "BF16"),
                b + "mlp.mlp1_weight.blocks": Spec((experts, 2 * inner, hidden // 32, 16), "U8"),
                b + "mlp.mlp1_weight.scales": Spec((experts, 2 * inner, hidden // 32), "U8"),
                b + "mlp.mlp1_bias": Spec((experts, 2 * inner), "BF16"),
                b + "mlp.mlp2_weight.blocks": Spec((experts, hidden, inner // 32, 16), "U8"),
                b + "mlp.mlp2_weight.scales": Spec((experts, hidden, inner // 32), "U8"),
                b + "mlp.mlp2_bias": Spec((experts, hidden), "BF16"),
            }
        )
    return specs


_HF_TOP = {
    "embedding.weight": "model.embed_tokens.weight",
    "unembedding.weight": "lm_head.weight",
    "norm.scale": "model.norm.weight",
}
_HF_BLOCK = {
    "attn.norm.scale": "input_layernorm.weight",
    "attn.sinks": "self_attn.sinks",
    "attn.out.weight": "self_attn.o_proj.weight",
    "attn.out.bias": "self_attn.o_proj.bias",
    "mlp.norm.scale": "post_attention_layernorm.weight",
    "mlp.gate.weight": "mlp.router.weight",
    "mlp.gate.bias": "mlp.router.bias",
    "mlp.mlp1_weight.blocks": "mlp.experts.gate_up_proj_blocks",
    "mlp.mlp1_weight.scales": "mlp.experts.gate_up_proj_scales",
    "mlp.mlp1_bias": "mlp.experts.gate_up_proj_bias",
    "mlp.mlp2_weight.blocks": "mlp.experts.down_proj_blocks",
    "mlp.mlp2_weight.scales": "mlp.experts.down_proj_scales",
    "mlp.mlp2_bias": "mlp.experts.down_proj_bias",
}
_QKV = ("q_proj", "k_proj", "v_proj")


def hf_names(name: str) -> list[str]:
    """The Hugging Face tensor names holding an original-layout tensor (three for qkv)."""
    if name in _HF_TOP:
        return [_HF_TOP[name]]
    _, layer, rest = name.split(".", 2)
    prefix = f"model.layers.{layer}."
    if rest in ("attn.qkv.weight", "attn.qkv.bias"):
        kind = rest.rsplit(".", 1)[1]
        return [f"{prefix}self_attn.{proj}.{kind}" for proj in _QKV]
    return [prefix + _HF_BLOCK[rest]]


def _header(shard: Path) -> tuple[int, dict[str, Any]]:
    """A safetensors file's header: where its data starts, and each tensor's entry (data_offsets from there)."""
    with shard.open("rb") as handle:
        length = int.from_bytes(handle.read(8), "little")
        return 8 + length, json.loads(handle.read(length))


def _config_path(directory: Path) -> Path:
    for candidate in (directory / "config.json", directory / "original" / "config.json"):
        if candidate.is_file():
            return candidate
    raise CheckpointError(
        f"{directory}: no config.json (a gpt-oss checkpoint directory holds config.json and *.safetensors)"
    )


def _shards(directory: Path) -> list[Path]:
    index = directory / INDEX
    if index.is_file():
        try:
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{index}: not a safetensors index ({exc})") from None
        shards = [directory / name for name in files]
        missing = [str(path) for path in shards if not path.is_file()]
        if missing:
            raise CheckpointError(f"{index} names files that are missing: {', '.join(missing)}")
        return shards
    shards = sorted(directory.glob("*.safetensors"))
    if not shards:
        raise CheckpointError(f"{directory}: no *.safetensors files")
    return shards


class Checkpoint:
    """An opened checkpoint: its config, layout and a checked, memory-mapped view of every tensor."""

    def __init__(self, path: str | Path) -> None:
        directory = Path(path)
        if not directory.is_dir():
            raise CheckpointError(f"{directory}: not a directory")
        config_path = _config_path(directory)
        try:
            raw = json.loads(config_path.read_text())
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{config_path}: not readable JSON ({exc})") from None
        self.config = ModelConfig.from_json(raw, str(config_path))
        weights_dir = config_path.parent if any(config_path.parent.glob("*.safetensors")) else directory
        self.directory = weights_dir
        self._files: dict[str, Any] = {}
        self._where: dict[str, Path] = {}
        self._headers: dict[Path, tuple[int, dict[str, Any]]] = {}
        for shard in _shards(weights_dir):
            try:
                handle = safe_open(str(shard), framework="numpy")
            except (SafetensorError, OSError) as exc:
                raise CheckpointError(f"{shard}: not a readable safetensors file ({exc})") from None
            self._files[str(shard)] = handle
            names = handle.keys()
            for name in names:
                self._where[name] = shard
        self.layout: Layout = "hf" if "model.embed_tokens.weight" in self._where else "original"
        self.fingerprint = self._fingerprint(config_path)
        self._specs = expected(self.config)
        self._check()

    def _fingerprint(self, config_path: Path) -> str:
        digest = hashlib.sha256(config_path.read_bytes())
        for shard in sorted({str(p) for p in self._where.values()}):
            stat = Path(shard).stat()
            digest.update(f"{Path(shard).name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
        return digest.hexdigest()[:16]

    def _check(self) -> None:
        dequantized = [n for n in self._where if n.endswith(DEQUANTIZED_EXPERTS)]
        if dequantized:
            raise CheckpointError(
                f"{self.directory}: the experts are dequantized ('{dequantized[0]}' and others, as most "
                "fine-tunes save them); the engine runs the MXFP4 experts gpt-oss was published with. Save the "
                "model with its experts quantized to MXFP4 (transformers: quantization_config Mxfp4Config, "
                "or the original checkpoint's `*_blocks`/`*_scales` layout) and point the engine at that"
            )
        for name, spec in self._specs.items():
            parts = hf_names(name) if self.layout == "hf" else [name]
            shapes = []
            for part in parts:
                if part not in self._where:
                    where = f" ({name} in the original layout)" if part != name else ""
                    raise CheckpointError(f"{self.directory}: tensor '{part}'{where} is missing")
                view = self._files[str(self._where[part])].get_slice(part)
                dtype = view.get_dtype()
                if dtype != spec.dtype and not (spec.dtype == "BF16" and dtype in FLOAT_VARIANTS):
                    raise CheckpointError(f"tensor '{part}' is {dtype}; gpt-oss stores it as {spec.dtype}")
                shapes.append(tuple(view.get_shape()))
            shape = (sum(s[0] for s in shapes), *shapes[0][1:]) if len(shapes) > 1 else shapes[0]
            if shape != spec.shape:
                raise CheckpointError(
                    f"tensor '{parts[0] if len(parts) == 1 else name}' has shape {list(shape)}; "
                    f"the config says {list(spec.shape)}"
                )

    def shape(self, name: str) -> tuple[int, ...]:
        """An original-layout tensor's shape (checked against the file at opening; nothing read)."""
        return self._specs[name].shape

    def location(self, name: str) -> tuple[Path, int, int] | None:
        """Where an original-layout tensor's bytes lie, as stored: (shard, byte offset, length); None when it is
        not one stored tensor (the Hugging Face layout's q/k/v parts)."""
        parts = hf_names(name) if self.layout == "hf" else [name]
        if len(parts) != 1:
            return None
        shard = self._where[parts[0]]
        if shard not in self._headers:  # read once per opened checkpoint: a rewritten file is a new checkpoint
            self._headers[shard] = _header(shard)
        data_start, entries = self._headers[shard]
        begin, end = entries[parts[0]]["data_offsets"]
        return shard, data_start + begin, end - begin

    def tensor(self, name: str) -> np.ndarray:
        """An original-layout tensor as stored (bf16 as ml_dtypes.bfloat16, MXFP4 parts as uint8)."""
        parts = hf_names(name) if self.layout == "hf" else [name]
        arrays = [self._files[str(self._where[part])].get_tensor(part) for part in parts]
        return arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=0)

    def float32(self, name: str) -> np.ndarray:
        return self.tensor(name).astype(np.float32)
