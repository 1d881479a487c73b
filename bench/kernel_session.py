"""An ONNX Runtime session of a small model with the engine's kernel library, its kernels made under chosen
environment variables (the kernels read their path switches, e.g. GATEWAY_ATTENTION_MMA, when a session makes
them), the process's environment restored after."""

from __future__ import annotations

import os
from pathlib import Path


def kernel_session(model: Path, kernels: Path, device: str, env: dict[str, int | str | None]):
    """`model` on `device` ("cuda" or "cpu") with `kernels` registered; each `env` value not None set meanwhile."""
    import onnxruntime as ort

    before = {name: os.environ.get(name) for name in env}
    for name, value in env.items():
        if value is not None:
            os.environ[name] = str(value)
    try:
        options = ort.SessionOptions()
        options.register_custom_ops_library(str(kernels))
        providers = ["CUDAExecutionProvider"] if device == "cuda" else ["CPUExecutionProvider"]
        return ort.InferenceSession(str(model), options, providers=providers)
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
