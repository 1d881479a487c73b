"""The `onnx` backend through its public interface: continuous batching gives each request the tokens it
gets alone, cancellation frees its pages, seeds repeat, and the gateway serves it to the openai SDK."""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.request
from pathlib import Path

import openai
import pytest
from aiohttp.test_utils import TestClient, TestServer
from engine_fixtures import make_checkpoint, tiny_config
from live_gateway import LiveGateway
from prometheus_client import CollectorRegistry

from backends.base import BackendError, EngineStats, GenerateRequest, Sampling
from backends.engine.backend import EngineBackend, EngineOptions, from_options
from backends.engine.kernels.build import KERNELS_ENV, kernel_choice
from backends.engine.kernels.variants import level
from backends.engine.runtime import cuda_unavailable_reason
from backends.engine.server import EngineServer
from gateway.config import Settings
from gateway.process.lifecycle import Lifecycle
from gateway.services import ConfigError, build_services
from harmony import Renderer, load_harmony_encoding

MODEL = "gpt-oss-20b"
PROMPTS = [[200006, 17360, 200008, 3575, 553], [1000, 2000, 3000], list(range(5, 60)), [42], [7, 7, 7, 7]]
NO_STOPS: tuple[int, ...] = ()
ENCODING = load_harmony_encoding()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("engine") / "model", tiny_config(), "hf")


def _options(checkpoint: Path, **extra) -> EngineOptions:
    """Prompts longer than 16 tokens are prefilled in chunks, between other sequences' decode steps."""
    return EngineOptions(
        checkpoint=str(checkpoint),
        max_positions=256,
        cache_dir=str(checkpoint.parent / "graphs"),
        prefill_chunk=16,
        **extra,
    )


async def _collect(backend: EngineBackend, prompt: list[int], count: int, sampling: Sampling) -> list[int]:
    tokens: list[int] = []
    request = GenerateRequest(prompt, count, NO_STOPS, "test", sampling)
    async for chunk in backend.generate(request):
        tokens += chunk.tokens
    return tokens


def test_concurrent_greedy_requests_get_exactly_their_solo_tokens(checkpoint):
    async def scenario() -> tuple[list[list[int]], list[list[int]], EngineStats]:
        backend = EngineBackend(_options(checkpoint, max_batch=3), ENCODING)  # 5 requests, 3 at once: some wait
        greedy = Sampling(temperature=0)
        alone = [await _collect(backend, prompt, 30, greedy) for prompt in PROMPTS]
        together = await asyncio.gather(*(_collect(backend, prompt, 30, greedy) for prompt in PROMPTS))
        await asyncio.sleep(0.05)  # the engine thread's bookkeeping after the last token
        stats = backend.engine_stats()
        await backend.aclose()
        return alone, list(together), stats

    alone, together, stats = asyncio.run(scenario())
    assert stats.max_batch == 3
    assert together == alone
    assert all(len(tokens) == 30 for tokens in alone)
    # what the metrics export: each request's first token comes from its prefill (of what the prefix cache did not
    # hold: the second time, all but the last prompt token), the other 29 from decode steps
    assert stats.prefix_hit_tokens == sum(len(prompt) - 1 for prompt in PROMPTS)
    assert stats.prefill_tokens == 2 * sum(len(prompt) for prompt in PROMPTS) - stats.prefix_hit_tokens
    assert stats.decode_tokens == 2 * len(PROMPTS) * 29 and stats.decode_steps < stats.decode_tokens
    assert (stats.running, stats.waiting, stats.kv_tokens) == (0, 0, 0)
    assert stats.kv_capacity_tokens >= 3 * 256
    assert stats.kv_pages["full"].in_use == 0 and stats.kv_pages["full"].cached > 0


class RecordingRuntime:
    """The engine's runtime, with the tokens of each step's rows written down."""

    def __init__(self, runtime) -> None:
        self.inner = runtime
        self.calls: list[list[int]] = []

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def run(self, step):
        self.calls.append([len(tokens) for tokens in step.tokens])
        return self.inner.run(step)


def test_a_long_prompt_is_prefilled_between_the_decode_steps_of_others(checkpoint):
    long_prompt = list(range(1000, 1150))  # 150 tokens: 10 chunks of 16

    async def scenario() -> tuple[list[list[int]], list[list[int]], list[tuple[str, int]]]:
        backend = EngineBackend(_options(checkpoint, max_batch=2, prefix_cache_tokens=0), ENCODING)
        greedy = Sampling(temperature=0)
        alone = [await _collect(backend, PROMPTS[1], 60, greedy), await _collect(backend, long_prompt, 10, greedy)]
        batcher = backend._batcher
        recorder = RecordingRuntime(batcher.runtime)
        batcher.runtime = recorder
        placeholder = backend.generate(GenerateRequest(PROMPTS[0], 200, NO_STOPS, "placeholder", greedy))
        await anext(placeholder)
        short = backend.generate(GenerateRequest(PROMPTS[1], 60, NO_STOPS, "short", greedy))
        first = [(await anext(short)).tokens[0] for _ in range(3)]  # decoding before the long one arrives
        await placeholder.aclose()  # its place in the batch frees: the long prompt takes it
        while batcher.active != 1:
            await asyncio.sleep(0.001)
        rest = asyncio.create_task(_drain(short))
        long_tokens = await _collect(backend, long_prompt, 10, greedy)
        together = [first + await rest, long_tokens]
        await backend.aclose()
        return alone, together, recorder.calls

    alone, together, calls = asyncio.run(scenario())
    assert together == alone
    long_chunks = [rows for rows in calls if max(rows) >= 6]  # the other prompts are 5 tokens or fewer
    assert [max(rows) for rows in long_chunks] == [16] * 9 + [6]
    beside_a_decode_row = [rows for rows in long_chunks if 1 in rows]
    assert len(beside_a_decode_row) >= 9  # the short sequence kept decoding, in the same steps as the chunks


async def _drain(stream) -> list[int]:
    return [token async for chunk in stream for token in chunk.tokens]


def test_a_seed_repeats_a_sampled_answer_and_closing_frees_the_pages(checkpoint):
    async def scenario() -> None:
        backend = EngineBackend(_options(checkpoint, max_batch=2), ENCODING)
        seeded = Sampling(temperature=1.0, top_p=0.9, seed=11)
        # the first answer leaves the prompt in the prefix cache: the ones after it compute only its last token, in a
        # step of its own, where int8 activations may round the logits' last digits otherwise (docs/backends.md)
        await _collect(backend, PROMPTS[0], 25, seeded)
        again = await _collect(backend, PROMPTS[0], 25, seeded)
        assert backend.engine_stats().prefix_hit_tokens > 0 and again == await _collect(backend, PROMPTS[0], 25, seeded)
        assert again != await _collect(backend, PROMPTS[0], 25, Sampling(temperature=1.0, top_p=0.9, seed=12))
        stream = backend.generate(GenerateRequest(PROMPTS[1], 200, NO_STOPS, "cancel", Sampling(temperature=0)))
        for _ in range(3):
            await anext(stream)
        batcher = backend._batcher
        assert batcher.active == 1
        await stream.aclose()
        deadline = time.monotonic() + 5
        while batcher.active and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert batcher.active == 0
        assert backend.engine_stats().kv_pages["full"].in_use == 0
        await backend.aclose()

    asyncio.run(scenario())


def test_the_gateway_serves_the_engine_to_the_sdk(checkpoint):
    options = {"checkpoint": str(checkpoint), "max_positions": 1024, "cache_dir": str(checkpoint.parent / "graphs")}
    settings = Settings(backends={"engine": {"kind": "onnx", "options": options, "models": [MODEL]}})
    live = LiveGateway(settings).start()
    try:
        deadline = time.monotonic() + 60
        while not live.call(live.services.backends[MODEL].ready()):
            assert time.monotonic() < deadline, "the engine did not load"
            time.sleep(0.05)
        with urllib.request.urlopen(live.url + "/readyz", timeout=5) as ready:
            assert ready.status == 200
            engine = json.loads(ready.read())["engines"][MODEL]
            assert engine["status"] == "ready" and engine["device"] in ("cpu", "cuda")
            assert engine["dtype"] == ("bfloat16" if engine["device"] == "cuda" else "float32")
        client = openai.OpenAI(base_url=live.url + "/v1", api_key="sk-x", max_retries=0)
        response = client.responses.create(model=MODEL, input="Hello", max_output_tokens=24, temperature=0)
        assert response.status in ("completed", "incomplete")
        assert 0 < response.usage.output_tokens <= 24 and response.usage.input_tokens > 10
        chunks = list(
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=16, stream=True
            )
        )
        assert chunks[-1].choices[0].finish_reason in ("stop", "length")
        assert client.models.retrieve(MODEL).id == MODEL
        with pytest.raises(openai.BadRequestError) as overflow:  # past max_positions: refused, naming the input
            client.responses.create(model=MODEL, input="word " * 1100)
        assert overflow.value.code == "context_length_exceeded" and overflow.value.param == "input"
        filled = client.responses.create(model=MODEL, input="Hello", temperature=0)  # the answer gets what is left
        assert filled.usage.input_tokens + filled.usage.output_tokens <= 1024
        assert filled.status == "incomplete" and filled.incomplete_details.reason == "max_output_tokens"
    finally:
        live.stop()


def test_bad_engine_options_stop_the_gateway_at_start(tmp_path):
    encoding = ENCODING
    for options, named in (
        ({"checkpoint": str(tmp_path / "absent")}, "options.checkpoint"),
        ({"max_batch": 0}, "options.max_batch"),
        ({"weights": "x"}, "options.weights"),
        ({"moe": "dense"}, "options.moe"),
        ({"moe": "qmoe", "device": "cpu"}, "options.moe qmoe needs the cuda device"),
    ):
        settings = Settings(backends={"engine": {"kind": "onnx", "options": options, "models": [MODEL]}})
        with pytest.raises(ConfigError) as error:
            build_services(settings, Renderer(encoding))
        assert named in str(error.value)
    assert from_options({"checkpoint": str(tmp_path)}, encoding) is not None  # exists: checked when loading


@pytest.mark.skipif(cuda_unavailable_reason(0) is None, reason="CUDA runs here: device cuda is no error")
def test_device_cuda_where_it_cannot_run_stops_the_gateway_at_start_with_the_reason():
    settings = Settings(backends={"engine": {"kind": "onnx", "options": {"device": "cuda"}, "models": [MODEL]}})
    with pytest.raises(ConfigError) as error:
        build_services(settings, Renderer(ENCODING))
    message = str(error.value)
    assert message.startswith("backends.engine: onnx backend: options.device: cuda was asked for, but")
    assert cuda_unavailable_reason(0) in message


def test_a_checkpoint_that_fails_to_load_fails_requests_cleanly(tmp_path):
    (tmp_path / "config.json").write_text("{}")

    async def scenario() -> str:
        backend = EngineBackend(EngineOptions(checkpoint=str(tmp_path), cache_dir=str(tmp_path / "graphs")), ENCODING)
        try:
            await _collect(backend, [1, 2, 3], 5, Sampling())
        except Exception as exc:  # the type and message are what is checked
            assert not await backend.ready()
            return f"{type(exc).__name__}: {exc}"
        raise AssertionError("a request on an unloadable checkpoint succeeded")

    message = asyncio.run(scenario())
    assert message.startswith("BackendError: The model could not be loaded:") and "missing or bad field" in message


def test_an_engine_thread_stopped_by_a_bug_fails_every_request_and_goes_unready(checkpoint):
    """A step that raises where no step should: the requests running and waiting end in an error, a request sent
    afterwards fails at once, and the engine says it is not ready and why (no request waits on a dead thread)."""
    greedy = Sampling(temperature=0)

    async def scenario() -> tuple[list[object], object, bool, dict[str, str]]:
        backend = EngineBackend(_options(checkpoint, max_batch=2), ENCODING)
        assert len(await _collect(backend, PROMPTS[0], 3, greedy)) == 3
        batcher = backend._batcher
        assert batcher is not None
        steps = 0
        step = batcher._step

        def failing_step() -> None:
            nonlocal steps
            steps += 1
            if steps == 4:
                raise KeyError("a bookkeeping bug")
            step()

        batcher._step = failing_step  # type: ignore[method-assign]
        running = [asyncio.wait_for(_collect(backend, prompt, 40, greedy), 30) for prompt in PROMPTS[1:4]]
        outcomes = await asyncio.gather(*running, return_exceptions=True)
        try:
            await asyncio.wait_for(_collect(backend, PROMPTS[4], 4, greedy), 30)
            afterwards: object = "answered"
        except Exception as exc:  # the type and message are what is checked
            afterwards = exc
        ready, described = await backend.ready(), backend.describe()
        server = TestServer(EngineServer(backend, None, Lifecycle(), 1 << 20).app(CollectorRegistry()))
        async with TestClient(server) as client:
            probe = await client.get("/readyz")
            readyz = (probe.status, (await probe.json())["error"]["message"])
        await backend.aclose()
        return outcomes, afterwards, ready, described, readyz

    outcomes, afterwards, ready, described, readyz = asyncio.run(scenario())
    for outcome in [*outcomes, afterwards]:
        assert isinstance(outcome, BackendError) and "stopped on an internal error" in str(outcome), outcome
    assert not ready and described["status"] == "stopped" and "internal error" in described["error"]
    assert readyz == (503, "The model is unavailable: the engine stopped on an internal error")


def _loaded(backend: EngineBackend) -> dict[str, str]:
    deadline = time.monotonic() + 120
    while backend.describe()["status"] == "loading":
        assert time.monotonic() < deadline, "the engine did not load"
        time.sleep(0.05)
    return backend.describe()


def test_a_float16_engine_on_the_cpu_generates_what_the_float32_engine_does(checkpoint):
    greedy = Sampling(temperature=0)

    async def run(dtype: str) -> tuple[dict[str, str], list[int]]:
        backend = EngineBackend(_options(checkpoint, device="cpu", dtype=dtype), ENCODING)
        described = await asyncio.get_running_loop().run_in_executor(None, _loaded, backend)
        tokens = await _collect(backend, PROMPTS[2], 40, greedy)
        await backend.aclose()
        return described, tokens

    (wide, wide_tokens), (narrow, narrow_tokens) = asyncio.run(run("float32")), asyncio.run(run("float16"))
    variant = kernel_choice().variant  # the CPU variant the kernels were built in, as /readyz says it
    assert variant == f"native ({level()} level)" or os.environ.get(KERNELS_ENV), variant
    placed = {
        "status": "ready",
        "device": "cpu",
        "moe": "mxfp4moe",
        "sampler": "kernel",
        "cpu_kernels": variant,
        "moe_activations": "int8x2",  # `auto`: the CPU kernel's decode on two int8 pieces
    }
    assert wide == {**placed, "dtype": "float32"} and narrow == {**placed, "dtype": "float16"}
    assert narrow_tokens == wide_tokens and len(set(wide_tokens)) > 3


def test_an_engine_that_cannot_run_says_why(checkpoint):
    """bf16 on the CPU, CUDA asked for where it does not load, and QMoE where `auto` found no CUDA: unready,
    the reason in describe() and in every request's error, never None."""
    cases = [({"device": "cpu", "dtype": "bfloat16"}, "bfloat16 needs the cuda device")]
    if cuda_unavailable_reason(0) is not None:
        cases.append(({"device": "cuda"}, "device cuda was asked for, but"))  # the backend made directly
        cases.append(({"moe": "qmoe", "dtype": "float16"}, "moe qmoe needs the cuda device"))
    for extra, reason in cases:
        backend = EngineBackend(_options(checkpoint, **extra), ENCODING)
        described = _loaded(backend)
        assert described["status"] == "failed" and reason in described["error"]

        async def ask(backend: EngineBackend = backend, reason: str = reason) -> None:
            assert not await backend.ready()
            with pytest.raises(BackendError, match=reason):
                await _collect(backend, PROMPTS[0], 4, Sampling(temperature=0))

        asyncio.run(ask())


def test_the_numpy_sampler_chooses_what_the_sampler_kernel_does(checkpoint):
    """The same logits sampled by the SampleTokens kernel and, with it taken away, by the NumPy sampler: the same
    tokens for a seeded nucleus draw with a penalty and for greedy; without the kernels the engine says so."""
    seeded = Sampling(temperature=1.0, top_p=0.9, seed=5, presence_penalty=0.5)
    greedy = Sampling(temperature=0)

    async def scenario() -> tuple[list[list[int]], list[list[int]], dict[str, str]]:
        # no prefix reuse: a prompt's last token run alone rounds its logits otherwise than inside a longer chunk
        backend = EngineBackend(_options(checkpoint, max_batch=2, prefix_cache_tokens=0), ENCODING)
        kernel = [await _collect(backend, PROMPTS[0], 40, seeded), await _collect(backend, PROMPTS[1], 40, greedy)]
        backend._batcher.runtime._sampler = None  # the runtime as it is built without the kernel library
        host = [await _collect(backend, PROMPTS[0], 40, seeded), await _collect(backend, PROMPTS[1], 40, greedy)]
        await backend.aclose()
        plain = EngineBackend(_options(checkpoint, kernels=False), ENCODING)
        described = await asyncio.get_running_loop().run_in_executor(None, _loaded, plain)
        await plain.aclose()
        return kernel, host, described

    kernel, host, described = asyncio.run(scenario())
    assert kernel == host and len(set(kernel[0])) > 5
    assert described["sampler"] == "numpy"


def test_a_pool_too_small_for_the_load_preempts_and_every_answer_completes(checkpoint):
    """Four sequences of 140 positions each need 20 pages of 32; the full-attention pool holds 9: the latest are
    preempted as the others grow (their pages given back) and run again from what they wrote, and every answer is
    the one it gets alone."""
    prompts = [[*range(base, base + 40)] for base in (1000, 2000, 3000, 4000)]

    async def scenario() -> tuple[list[list[int]], list[list[int]], EngineStats]:
        backend = EngineBackend(_options(checkpoint, max_batch=4, kv_cache_tokens=256), ENCODING)
        greedy = Sampling(temperature=0)
        alone = [await _collect(backend, prompt, 100, greedy) for prompt in prompts]
        together = await asyncio.gather(*(_collect(backend, prompt, 100, greedy) for prompt in prompts))
        await asyncio.sleep(0.05)
        stats = backend.engine_stats()
        await backend.aclose()
        return alone, list(together), stats

    alone, together, stats = asyncio.run(scenario())
    assert stats.kv_pages["full"].pages == 9
    assert stats.preemptions > 0
    assert together == alone and all(len(tokens) == 100 for tokens in together)
    assert stats.kv_pages["full"].in_use == 0


@pytest.mark.parametrize("spinning", [None, True])
def test_the_engine_s_threads_sleep_between_operators_unless_asked_to_spin(checkpoint, spinning):
    """By default both of the engine's ONNX Runtime pools sleep when idle (spinning, each held the cores the
    other, and the gateway's event loop, needed: bench/spinning_bench.py); `spinning` makes the decoder's spin,
    never the sampler's."""
    extra = {} if spinning is None else {"spinning": spinning}

    async def scenario() -> tuple[str, str, list[int]]:
        backend = EngineBackend(_options(checkpoint, max_batch=2, **extra), ENCODING)
        try:
            tokens = await _collect(backend, PROMPTS[0], 4, Sampling(temperature=0))
            runtime = backend._batcher.runtime
            key = "session.intra_op.allow_spinning"
            decoder = runtime.session.get_session_options().get_session_config_entry(key)
            sampler = runtime._sampler.session.get_session_options().get_session_config_entry(key)
            return decoder, sampler, tokens
        finally:
            await backend.aclose()

    decoder, sampler, tokens = asyncio.run(scenario())
    assert (decoder, sampler) == ("1" if spinning else "0", "0")
    assert len(tokens) == 4
