"""A checkpoint at gpt-oss's real width (hidden 2880, 64 query / 8 KV heads of 64, vocabulary 201,088; two
layers and four experts so it stays small on disk) converts, loads and generates through the public
backend, and its logits match the independent NumPy reference: small models hide size bugs (the fp32
embedding alone is over protobuf's 2 GiB message limit)."""

from __future__ import annotations

import asyncio
import gc
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from engine_fixtures import REAL_WIDTH, REAL_WIDTH_PROMPT, loaded, make_checkpoint
from engine_reference import ReferenceModel
from engine_servers import EngineServer

from backends.base import GenerateRequest, Sampling, TokenLogprob
from backends.engine.backend import EngineBackend, EngineOptions
from backends.engine.checkpoint import Checkpoint
from backends.engine.graph import GraphOptions
from backends.engine.kernels.build import kernel_library
from backends.engine.model_cache import compiled_model
from backends.engine.paged_runner import PagedRunner
from backends.engine.qmoe import codes_by_column
from backends.registry import create_backend
from harmony import load_harmony_encoding

PROMPT = REAL_WIDTH_PROMPT
GENERATED = 4
TOLERANCE = 2e-4  # float32 sums over 2880-wide rows against float64
RELATIVE_TOLERANCE = 2e-5  # the same, over the reference's largest logit (a tenth of it measured: a drift shows)
PAGE = 8  # the prompt spans pages; reuse takes whole pages by reference and copies the rest


def _options(checkpoint: Path, cache: Path) -> dict:
    return {
        "checkpoint": str(checkpoint), "max_positions": 64, "max_batch": 1, "cache_dir": str(cache), "device": "cpu",
        "page_size": PAGE,
    }  # fmt: skip


def _generate(backend) -> list[tuple[list[int], int, list[TokenLogprob]]]:
    """Greedy (tokens, prompt tokens reused, logprobs with 3 alternatives) through the backend for: the prompt;
    the prompt again; the prompt and the first two answer tokens, whose greedy tokens must be the first answer's
    last two."""

    async def one(prompt: list[int], count: int) -> tuple[list[int], int, list[TokenLogprob]]:
        tokens, cached, logprobs = [], -1, []
        request = GenerateRequest(prompt, count, (), "wide", Sampling(temperature=0), top_logprobs=3)
        async for chunk in backend.generate(request):
            tokens += chunk.tokens
            logprobs += chunk.logprobs or []
            cached = chunk.cached_tokens if chunk.cached_tokens is not None else cached
        return tokens, cached, logprobs

    async def run() -> list[tuple[list[int], int, list[TokenLogprob]]]:
        if isinstance(backend, EngineBackend):
            await loaded(backend)
        first = await one(PROMPT, GENERATED)
        results = [first, await one(PROMPT, GENERATED), await one(PROMPT + first[0][:2], GENERATED - 2)]
        await backend.aclose()
        return results

    return asyncio.run(run())


def test_a_real_width_checkpoint_converts_serves_and_matches_the_reference(tmp_path):
    checkpoint = make_checkpoint(tmp_path / "wide", REAL_WIDTH, "original")
    cache = tmp_path / "graphs"
    in_process = _generate(EngineBackend(EngineOptions(**_options(checkpoint, cache)), load_harmony_encoding()))
    (tokens, fresh, logprobs), (again, repeated, _), (rest, continued, _) = in_process
    gc.collect()  # the backend's session goes before the next one loads
    assert len(tokens) == GENERATED
    # prefix reuse at the real width: the repeat keeps all but the last prompt token, the continuation all
    # but the last of what the first answer filled; the answers are the ones a full prefill gave
    assert (fresh, repeated, continued) == (0, len(PROMPT) - 1, len(PROMPT) + 1)
    assert again == tokens and rest == tokens[2:]

    model = compiled_model(Checkpoint(checkpoint), GraphOptions(64, page_size=PAGE), cache)  # the backend's graph
    graph = onnx.load(str(model), load_external_data=False).graph
    stored = {tensor.name: tensor for tensor in graph.initializer}
    where = {name: {entry.key: entry.value for entry in tensor.external_data} for name, tensor in stored.items()}
    assert sum(int(entry.get("length", 0)) for entry in where.values()) > 2**31  # past protobuf's limit
    # the experts, the embedding and the unembedding are the checkpoint's own bytes (a link to its file, no copy);
    # the embedding stays bf16, its gathered rows widened (a float32 table would take 2.3 GB)
    for name in ("embedding.weight", "unembedding.weight", "block.0.mlp.mlp1_weight.fp4"):
        assert where[name]["location"].startswith("linked-"), name
    assert stored["embedding.weight"].data_type == onnx.TensorProto.BFLOAT16
    nodes = graph.node
    layers = REAL_WIDTH.num_hidden_layers
    ops = Counter(node.op_type for node in nodes)
    # nine nodes a layer: two norms, three projections (the router's and QKV's with a bias Add; the attention
    # output's bias goes to the following norm, as its fourth input), attention and the MoE; the projections
    # and the unembedding read the checkpoint's bf16 weights as they are (DenseBF16), no float32 copy
    assert (ops["DenseBF16"], ops["MatMul"], ops["Add"], ops["PagedAttention"], ops["MXFP4MoE"]) == (
        3 * layers + 1,
        0,
        2 * layers,
        layers,
        layers,
    )
    assert stored["unembedding.weight"].data_type == onnx.TensorProto.BFLOAT16
    assert list(stored["unembedding.weight"].dims) == [REAL_WIDTH.vocab_size, REAL_WIDTH.hidden_size]
    biased = [n for n in nodes if n.op_type == "SkipSimplifiedLayerNormalization" and len(n.input) == 4]
    assert len(biased) == layers and all(n.input[3].endswith("attn.out.bias") for n in biased)
    runtime = PagedRunner.create(str(model), REAL_WIDTH, 1, 64, PAGE, kernels=kernel_library())
    reference = ReferenceModel(checkpoint)
    logits = runtime.prefill(0, PROMPT)
    for position, token in enumerate(PROMPT):
        expected = reference.step(token, position)
    # the first answer token's logprob: the reference's exact log-softmax over the whole 201,088-token row
    wide = expected.astype(np.float64)
    log_softmax = wide - (wide.max() + np.log(np.exp(wide - wide.max()).sum()))
    assert abs(logprobs[0].logprob - log_softmax[tokens[0]]) < 2 * TOLERANCE
    assert all(entry.top[0] == (token, entry.logprob) for entry, token in zip(logprobs, tokens, strict=True))
    differences = [np.abs(logits - expected).max() / (1, np.abs(expected).max())]
    reference_tokens = []
    for position, token in enumerate(tokens, start=len(PROMPT)):
        reference_tokens.append(int(np.argmax(expected)))
        logits, expected = runtime.decode([(0, token, position)])[0], reference.step(token, position)
        differences.append(np.abs(logits - expected).max() / (1, np.abs(expected).max()))
    worst, relative = (float(value) for value in np.max(differences, axis=0))
    assert reference_tokens == tokens
    assert worst < TOLERANCE, f"largest logit difference {worst:.2e}"
    # of the largest logit: 2.2e-6 measured with AVX-512 kernels and with their x86-64-v3 build, 3.4e-6 with the
    # portable x86-64 build
    assert relative < RELATIVE_TOLERANCE, f"largest logit difference {relative:.2e} of the largest logit"
    del runtime
    gc.collect()
    _qmoe_graph_at_real_width(Checkpoint(checkpoint), cache)
    # the same engine as a server, through the `engine` kind: the same tokens, reuse and 201,088-wide logprobs
    server = EngineServer(_options(checkpoint, cache), tmp_path / "server.log").start()
    try:
        remote = create_backend("engine", {"urls": [server.url], "context_length": 64}, load_harmony_encoding())
        assert _generate(remote) == in_process
    finally:
        server.stop()


def _qmoe_graph_at_real_width(checkpoint: Checkpoint, cache: Path) -> None:
    """The `moe` qmoe graph of the same checkpoint: each QMoE node's experts by column at the real width (fc1
    [E, 2880, 2880], fc2 [E, 2880, 1440]: the codes of each input column two a byte along the output rows, as
    ONNX Runtime's kernels read them), the scales as stored, and ONNX Runtime loads the whole graph but the
    CUDA-only QMoE kernel (tests/engine/test_engine_qmoe.py checks the rest at small width)."""
    model = compiled_model(checkpoint, GraphOptions(64, "float16", "qmoe"), cache)
    graph = onnx.load(str(model), load_external_data=False).graph
    tensors = {tensor.name: tensor for tensor in graph.initializer}
    nodes = [node for node in graph.node if node.op_type == "QMoE"]
    assert len(nodes) == REAL_WIDTH.num_hidden_layers
    e, h, i = REAL_WIDTH.num_experts, REAL_WIDTH.hidden_size, REAL_WIDTH.intermediate_size
    for layer, node in enumerate(nodes):
        for codes, scales, fc, rows, columns in ((2, 3, "mlp1", 2 * i, h), (5, 6, "mlp2", h, i)):
            code_tensor, scale_tensor = tensors[node.input[codes]], tensors[node.input[scales]]
            assert list(code_tensor.dims) == [e, columns, rows // 2]
            assert list(scale_tensor.dims) == [e, rows, columns // 32]
            onnx.external_data_helper.load_external_data_for_tensor(code_tensor, str(model.parent))
            blocks = checkpoint.tensor(f"block.{layer}.mlp.{fc}_weight.blocks")
            assert code_tensor.raw_data == codes_by_column(blocks).tobytes()
    with pytest.raises(Exception, match="QMoE") as error:
        ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    assert "NOT_IMPLEMENTED" in str(error.value)
