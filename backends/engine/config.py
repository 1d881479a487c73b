"""gpt-oss model shape, read from either checkpoint layout's config.json."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

SWIGLU_ALPHA = 1.702  # gpt-oss's swiglu: x * sigmoid(1.702 x)


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message names the file or tensor and what is wrong."""


@dataclass(frozen=True, slots=True)
class ModelConfig:
    num_hidden_layers: int = 36
    num_experts: int = 128
    experts_per_token: int = 4
    vocab_size: int = 201088
    hidden_size: int = 2880
    intermediate_size: int = 2880
    swiglu_limit: float = 7.0
    head_dim: int = 64
    num_attention_heads: int = 64
    num_key_value_heads: int = 8
    sliding_window: int = 128
    initial_context_length: int = 4096
    rope_theta: float = 150000.0
    rope_scaling_factor: float = 32.0
    rope_ntk_alpha: float = 1.0
    rope_ntk_beta: float = 32.0

    @property
    def qkv_rows(self) -> int:
        return (self.num_attention_heads + 2 * self.num_key_value_heads) * self.head_dim

    @property
    def context_length(self) -> int:
        return int(self.initial_context_length * self.rope_scaling_factor)

    def is_sliding(self, layer: int) -> bool:
        """Even layers attend to the last `sliding_window` positions; odd layers to all."""
        return layer % 2 == 0

    def original_json(self) -> dict[str, Any]:
        return asdict(self)

    def hf_json(self) -> dict[str, Any]:
        return {
            "architectures": ["GptOssForCausalLM"],
            "model_type": "gpt_oss",
            "num_hidden_layers": self.num_hidden_layers,
            "num_local_experts": self.num_experts,
            "num_experts_per_tok": self.experts_per_token,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "swiglu_limit": self.swiglu_limit,
            "head_dim": self.head_dim,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "sliding_window": self.sliding_window,
            "max_position_embeddings": self.context_length,
            "rope_theta": self.rope_theta,
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": self.rope_scaling_factor,
                "beta_fast": self.rope_ntk_beta,
                "beta_slow": self.rope_ntk_alpha,
                "original_max_position_embeddings": self.initial_context_length,
                "truncate": False,
            },
            "layer_types": [
                "sliding_attention" if self.is_sliding(i) else "full_attention" for i in range(self.num_hidden_layers)
            ],
            "quantization_config": {
                "quant_method": "mxfp4",
                "modules_to_not_convert": [
                    "model.layers.*.self_attn",
                    "model.layers.*.mlp.router",
                    "model.embed_tokens",
                    "lm_head",
                ],
            },
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], source: str) -> ModelConfig:
        """Either layout's config.json; `source` names the file in errors."""
        hf = "num_local_experts" in data
        try:
            if hf:
                # transformers 5 writes rope_parameters (theta inside); earlier versions rope_theta + rope_scaling
                rope = data.get("rope_parameters") or data.get("rope_scaling") or {}
                theta = rope.get("rope_theta", data.get("rope_theta"))
                values = {
                    "num_hidden_layers": data["num_hidden_layers"],
                    "num_experts": data["num_local_experts"],
                    "experts_per_token": data["num_experts_per_tok"],
                    "vocab_size": data["vocab_size"],
                    "hidden_size": data["hidden_size"],
                    "intermediate_size": data["intermediate_size"],
                    "swiglu_limit": data.get("swiglu_limit", 7.0),
                    "head_dim": data["head_dim"],
                    "num_attention_heads": data["num_attention_heads"],
                    "num_key_value_heads": data["num_key_value_heads"],
                    "sliding_window": data["sliding_window"],
                    "initial_context_length": rope.get("original_max_position_embeddings", 4096),
                    "rope_theta": theta if theta is not None else data["rope_theta"],
                    "rope_scaling_factor": rope.get("factor", 32.0),
                    "rope_ntk_alpha": rope.get("beta_slow", 1.0),
                    "rope_ntk_beta": rope.get("beta_fast", 32.0),
                }
            else:  # the original layout's config.json holds every field
                values = {key: data[key] for key in cls.__dataclass_fields__}
            config = cls(**values)
        except (KeyError, TypeError) as exc:
            raise CheckpointError(f"{source}: missing or bad field {exc}") from None
        config.check(source)
        return config

    def check(self, source: str) -> None:
        positive = ("num_hidden_layers", "num_experts", "experts_per_token", "vocab_size", "hidden_size")
        for name in (*positive, "intermediate_size", "head_dim", "num_attention_heads", "num_key_value_heads"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise CheckpointError(f"{source}: {name} must be a positive integer, not {value!r}")
        if self.experts_per_token > self.num_experts:
            raise CheckpointError(
                f"{source}: experts_per_token {self.experts_per_token} > num_experts {self.num_experts}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise CheckpointError(f"{source}: num_attention_heads is not a multiple of num_key_value_heads")
        if self.hidden_size % 32 or self.intermediate_size % 32:
            raise CheckpointError(f"{source}: hidden_size and intermediate_size must be multiples of 32 (MXFP4 blocks)")
        if self.head_dim % 2 or not math.isfinite(self.rope_theta) or self.rope_theta <= 1:
            raise CheckpointError(f"{source}: head_dim must be even and rope_theta > 1")


GPT_OSS_20B = ModelConfig(num_hidden_layers=24, num_experts=32)
GPT_OSS_120B = ModelConfig()
# the random-weight model served when no checkpoint is configured: real vocabulary, tiny widths
DEMO_CONFIG = ModelConfig(
    num_hidden_layers=2,
    num_experts=8,
    experts_per_token=4,
    hidden_size=64,
    intermediate_size=64,
    head_dim=16,
    num_attention_heads=8,
    num_key_value_heads=2,
)
SHAPES = {"gpt-oss-20b": GPT_OSS_20B, "gpt-oss-120b": GPT_OSS_120B, "demo": DEMO_CONFIG}
