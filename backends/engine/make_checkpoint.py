"""Random-weight gpt-oss checkpoints of any shape, in the original or the Hugging Face layout.

The experts are MXFP4 like the real ones (random 4-bit codes, E8M0 scales chosen so that each matrix
has about 1/sqrt(fan-in) spread), the rest bf16. Output is noise; the shapes and bytes are real, which
is what loading, graph building, parity and speed need. With `zero_experts`, the experts' codes and scales
are zeros left as holes in sparse files: a gpt-oss-120b-shaped checkpoint then takes about 4 GiB of disk
instead of 61 GiB and writes in under a minute, for speed checks (a kernel does the same work on zeros).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path

import ml_dtypes
import numpy as np

from .checkpoint import INDEX, Layout, Spec, expected, hf_names
from .config import ModelConfig

E2M1_RMS = math.sqrt(sum(v * v for v in (0, 0.5, 1, 1.5, 2, 3, 4, 6)) / 8)  # of a uniformly random code
DEFAULT_SHARD_BYTES = 2 * 1024**3


def _values(name: str, spec: Spec, rng: np.random.Generator) -> np.ndarray:
    shape = spec.shape
    if name.endswith(".blocks"):
        return rng.integers(0, 256, size=shape, dtype=np.uint8)
    if name.endswith(".scales"):
        fan_in = shape[-1] * 32
        exponent = round(math.log2(1 / (math.sqrt(fan_in) * E2M1_RMS)))
        return (127 + exponent + rng.integers(-1, 2, size=shape)).astype(np.uint8)
    if name.endswith("scale"):  # RMSNorm gains
        values = 1 + 0.1 * rng.standard_normal(shape)
    elif name == "embedding.weight" or name.endswith("sinks"):
        values = rng.standard_normal(shape)
    elif name.endswith(("bias", "mlp1_bias", "mlp2_bias")):
        values = 0.05 * rng.standard_normal(shape)
    else:  # a [out, in] matrix
        values = rng.standard_normal(shape) / math.sqrt(shape[-1])
    return values.astype(np.float32).astype(ml_dtypes.bfloat16)


def _tensors(
    config: ModelConfig, layout: Layout, seed: int, zero_experts: bool = False
) -> Iterator[tuple[str, np.ndarray | Spec]]:
    """(stored name, array) in checkpoint order, or (name, its spec) for an expert tensor left zero; q/k/v are
    split out of qkv for the HF layout."""
    rng = np.random.default_rng(seed)
    for name, spec in expected(config).items():
        names = hf_names(name) if layout == "hf" else [name]
        if zero_experts and name.endswith((".blocks", ".scales")):
            yield names[0], spec
            continue
        array = _values(name, spec, rng)
        if len(names) == 1:
            yield names[0], array
            continue
        heads = config.num_attention_heads * config.head_dim
        kv = config.num_key_value_heads * config.head_dim
        for part, piece in zip(names, np.split(array, [heads, heads + kv], axis=0), strict=True):
            yield part, np.ascontiguousarray(piece)


def random_moe_layer(config: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """One layer's expert tensors (`mlp1_weight.blocks`, ..., `mlp2_bias`), drawn as in a random checkpoint."""
    rng = np.random.default_rng(seed)
    prefix = "block.0.mlp."
    return {
        name.removeprefix(prefix): _values(name, spec, rng)
        for name, spec in expected(config).items()
        if name.startswith(prefix + "mlp")
    }


SAFETENSORS_DTYPES = {np.dtype(np.uint8): "U8", np.dtype(ml_dtypes.bfloat16): "BF16", np.dtype(np.float32): "F32"}


def _save(path: Path, tensors: dict[str, np.ndarray], zeros: dict[str, Spec]) -> None:
    """A safetensors file of `tensors` and of `zeros` (all-zero tensors, left as holes: never written)."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    layout = []
    for name, array in tensors.items():
        header[name] = {"dtype": SAFETENSORS_DTYPES[array.dtype], "shape": list(array.shape)}
        layout.append((name, array.nbytes, array))
    for name, spec in zeros.items():
        header[name] = {"dtype": spec.dtype, "shape": list(spec.shape)}
        layout.append((name, math.prod(spec.shape), None))  # U8 only: one byte per element
    for name, nbytes, _ in layout:
        header[name]["data_offsets"] = [offset, offset + nbytes]  # type: ignore[index]
        offset += nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    with path.open("wb") as handle:
        handle.write(len(encoded).to_bytes(8, "little") + encoded)
        for _, nbytes, array in layout:
            if array is None:
                handle.seek(nbytes, 1)
            else:
                handle.write(memoryview(np.ascontiguousarray(array).view(np.uint8).reshape(-1)))
        handle.truncate()


def write_random_checkpoint(
    directory: str | Path,
    config: ModelConfig,
    layout: Layout = "original",
    seed: int = 0,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    progress: Callable[[int, int], None] | None = None,
    zero_experts: bool = False,
) -> Path:
    """Write config.json and safetensors shards (with an index when there are several); return the directory."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    config_json = config.hf_json() if layout == "hf" else config.original_json()
    total = len(expected(config))
    shards: list[dict[str, np.ndarray]] = [{}]
    holes: dict[str, Spec] = {}
    size = 0
    written: list[tuple[str, list[str]]] = []

    def flush() -> None:
        index = len(written)
        name = f"model-{index:05d}.safetensors"
        _save(out / name, shards[-1], holes)
        written.append((name, [*shards[-1], *holes]))
        shards[-1] = {}
        holes.clear()

    for done, (name, tensor) in enumerate(_tensors(config, layout, seed, zero_experts), start=1):
        nbytes = tensor.nbytes if isinstance(tensor, np.ndarray) else math.prod(tensor.shape)
        if size and size + nbytes > shard_bytes:
            flush()
            size = 0
        if isinstance(tensor, np.ndarray):
            shards[-1][name] = tensor
        else:
            holes[name] = tensor
        size += nbytes
        if progress is not None:
            progress(min(done, total), total)
    flush()
    count = len(written)
    if count == 1:
        (out / written[0][0]).rename(out / "model.safetensors")
    else:
        weight_map = {}
        for index, (name, names) in enumerate(written):
            final = f"model-{index + 1:05d}-of-{count:05d}.safetensors"
            (out / name).rename(out / final)
            weight_map.update(dict.fromkeys(names, final))
        (out / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1))
    (out / "config.json").write_text(json.dumps(config_json, indent=1))
    return out
