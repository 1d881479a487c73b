"""QMoE's weights by column (backends/engine/qmoe.py) and bench/qmoe_layer.py's one-layer QMoE model, which
engine_check measures against our kernel on a GPU. Without one: the column layout holds the checkpoint's codes,
and ONNX Runtime accepts the model up to the kernel lookup (QMoE fp4 has CUDA kernels only)."""

from __future__ import annotations

import sys

import numpy as np
import onnxruntime as ort
import pytest
from paths import ROOT

from backends.engine.config import ModelConfig
from backends.engine.make_checkpoint import random_moe_layer
from backends.engine.qmoe import codes_by_column

sys.path.insert(0, str(ROOT / "bench"))
from qmoe_layer import qmoe_layer_model

CONFIG = ModelConfig(num_experts=4, experts_per_token=2, hidden_size=64, intermediate_size=96)


def _codes(packed: np.ndarray) -> np.ndarray:
    """Two codes a byte along the last axis, low nibble first, as one code a byte."""
    return np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(*packed.shape[:-1], -1)


def test_the_column_layout_holds_the_checkpoints_codes_by_column():
    blocks = random_moe_layer(CONFIG, seed=5)["mlp1_weight.blocks"]  # [E, 2I, H/32, 16]
    experts, rows, groups, _ = blocks.shape
    by_column = codes_by_column(blocks)
    assert by_column.shape == (experts, groups * 32, rows // 2)
    checkpoint_codes = _codes(blocks.reshape(experts, rows, groups * 16))  # [E, N, K]
    assert np.array_equal(_codes(by_column), checkpoint_codes.transpose(0, 2, 1))


def test_onnx_runtime_accepts_the_qmoe_model_up_to_its_kernel(tmp_path):
    model = qmoe_layer_model(CONFIG, random_moe_layer(CONFIG, seed=5), tmp_path, "bfloat16")
    with pytest.raises(Exception, match="Could not find an implementation for QMoE"):
        ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
