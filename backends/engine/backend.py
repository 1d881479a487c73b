"""The `onnx` backend: gpt-oss run in-process on ONNX Runtime, with continuous batching.

Options: `checkpoint` (a gpt-oss checkpoint directory, either layout; unset: a small random-weight model
generated once and cached, whose output is noise), `max_batch` (sequences running at once: the largest
decode batch), `max_positions` (the longest sequence: prompt + output), `kv_cache_tokens` (positions the
full-attention layers' page pool holds for all sequences together; unset: `max_batch` x `max_positions`;
the sliding-window layers get a pool of their windows), `page_size` (positions per KV page), `device` (`auto`: CUDA
when onnxruntime's CUDA provider loads here, else the CPU; `cuda`: the gateway stops at start if it
cannot; `cpu`), `device_id`, `dtype` (activations, non-expert weights, KV cache: `float32`, `float16`, `bfloat16`;
default bfloat16 on CUDA, float32 on the CPU), `moe` (`mxfp4moe`: our MXFP4MoE op, compiled kernels unless
`kernels` is false (the compiled SampleTokens op also chooses the tokens on the engine's device; without
the kernels, NumPy does on the host); `qmoe`: ONNX Runtime's contrib QMoE, CUDA in float16/bfloat16 only), `cuda_graph`
(decode steps replayed as CUDA graphs), `threads`, `cache_dir`; the prefix cache: `prefix_cache_tokens`
(tokens of pages no sequence holds that stay cached for later prompts that start the same way; unset:
the whole pool, 0: no reuse), `prefix_cache_scope` (`tenant`: a prompt is reused only within its tenant
and `prompt_cache_key`; `shared`: across tenants, see docs/backends.md).
The model loads in the background; readiness says when it is there.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

import numpy as np
import structlog
from opentelemetry import propagate, trace
from pydantic import BaseModel, ConfigDict, Field, model_validator

from backends.base import BackendError, Capabilities, Chunk, EngineStats, GenerateRequest, ServerLoad, parse_options
from backends.page_names import namespace_of
from harmony import HarmonyEncoding
from harmony.tokens import FIRST_SPECIAL, LAST_SPECIAL

from .batcher import Batcher, Sequence
from .checkpoint import Checkpoint
from .config import DEMO_CONFIG, CheckpointError
from .grammar import GrammarCompiler, TokenGuide
from .graph import Dtype, GraphOptions
from .host_costs import HostCosts
from .kernels import attention_tuning, moe_tuning
from .kernels.build import kernel_choice
from .make_checkpoint import write_random_checkpoint
from .model_cache import compiled_model, default_cache_dir
from .page_events import PageEvents
from .page_pool import KvPools
from .qmoe import MoeRealization, qmoe_unsupported_reason
from .runtime import DecoderRuntime, Device, EngineDeviceError, cuda_unavailable_reason, resolve_device

log = structlog.get_logger("backends.engine")
tracer = trace.get_tracer("gpt-oss-gateway.engine")

RANDOM_MODEL_WARNING = "gpt-oss-gateway: no engine checkpoint configured; serving a RANDOM model: its output is noise"


MAX_POSITIONS = 131072  # gpt-oss's context


DENSE_INT8_CPU_ONLY = "dense_int8 is a CPU option (a CUDA graph reads its dense weights in its dtype)"
MOE_INT8_CPU_KERNEL = (
    "moe_activations int8 and int8x2 are options of the compiled CPU MoE kernel (needs kernels, device cpu)"
)
# moe_activations: int8 pieces of each activation the CPU MoE kernel takes (none: float)
MOE_INT8_PIECES = {"float": 0, "int8": 1, "int8x2": 2}
MOE_INT8_CHOICES = ("int8", "int8x2")  # refused outside the CPU kernel; `auto` falls back to float there


class EngineOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    checkpoint: str | None = None
    """A gpt-oss checkpoint directory, in either layout (unset: a small random model, with a loud warning)."""
    max_batch: int = Field(default=8, ge=1, le=256)
    """Sequences running at once (the largest decode batch)."""
    max_positions: int = Field(default=4096, ge=16, le=MAX_POSITIONS)
    """Prompt and answer tokens per sequence."""
    kv_cache_tokens: int | None = Field(default=None, ge=16)
    """Positions the full-attention layers' page pool holds (default: `max_batch` x `max_positions`)."""
    page_size: int = Field(default=32, ge=8, le=256)
    """Positions per KV page: the unit of allocation, prefix sharing and the window rings."""
    prefill_chunk: int = Field(default=512, ge=16)
    """Prompt tokens per step while others decode, at most."""
    prefill_piece_ms: float = Field(default=5.0, ge=0, le=10_000)
    """A step runs the decode rows beside a piece of a prompt of about this long, so neither a request arriving nor a
    running answer's next token waits for a whole chunk (chunk_budget.py); 0: a step runs the whole chunk."""
    kernels: bool = True
    """Build and use the compiled MXFP4 MoE kernels (else the pure-ONNX realization)."""
    dense_int8: bool = False
    """CPU: the attention projections and the unembedding read in int8 with a scale per row (half the bytes of bf16;
    logits within the bound tests/engine/test_dense_int8.py states), the router in bf16."""
    moe_activations: Literal["auto", "float", "int8x2", "int8"] = "auto"
    """CPU: how the MoE kernel takes the activations, in decode (experts with fewer than four tokens in a step) and,
    in x86 builds with AVX2 or AVX-512 where AMX tiles do not run, in prefill too: `auto`, `int8x2` where the compiled
    CPU MoE kernel runs (device cpu, kernels, moe mxfp4moe), else `float`;
    `float`; `int8x2`, integer dot products of each 32 values as two int8 pieces, the value in steps of a 127th of the
    block's largest and its remainder in steps of a 254th of that; `int8`, the first piece alone, as llama.cpp's CPU
    path does for MXFP4 experts (logits within the bounds tests/engine/test_moe_int8.py states: int8x2's a 90th of
    int8's). `moe_int8_activations: true` is the older spelling of `int8`."""
    device: Device = "auto"
    """`auto` (CUDA when onnxruntime's CUDA provider loads, else the CPU), `cuda` or `cpu`."""
    device_id: int = Field(default=0, ge=0)
    """The CUDA device."""
    dtype: Dtype | None = None
    """Activations, non-expert weights and KV cache: `bfloat16`, `float16` or `float32` (None: bfloat16 on CUDA,
    float32 on the CPU)."""
    moe: MoeRealization = "mxfp4moe"
    """How each MoE runs: `mxfp4moe` (the compiled kernels) or `qmoe` (ONNX Runtime's QMoE, CUDA only)."""
    cuda_graph: bool = False
    """Replay decode steps as CUDA graphs, one per bucket of rows."""
    threads: int = Field(default=0, ge=0)
    """ONNX Runtime intra-op threads (0: one per core)."""
    spinning: bool = False
    """The decoder's ONNX Runtime intra-op threads spin awaiting work between operators (False: they sleep, leaving
    the cores to the gateway's event loop and other processes; bench/spinning_bench.py). The sampler's sleep."""
    cache_dir: str | None = None
    """Where converted graphs are kept (default ~/.cache/gpt-oss-gateway/graphs)."""
    prefix_cache_tokens: int | None = Field(default=None, ge=0)
    """Tokens of pages no sequence holds that stay cached for later prompts (default: the whole pool; 0: no reuse)."""
    prefix_cache_scope: Literal["tenant", "shared"] = "tenant"
    """`tenant`: a prompt is reused by its own tenant with the same `prompt_cache_key`; `shared`: by every tenant."""

    @model_validator(mode="before")
    @classmethod
    def _older_spelling(cls, data: Any) -> Any:
        if isinstance(data, dict) and "moe_int8_activations" in data:
            data = dict(data)
            older = data.pop("moe_int8_activations")
            if older not in (True, False):
                raise ValueError("moe_int8_activations (the older spelling of moe_activations) is true or false")
            spelled = "int8" if older else "float"
            if data.setdefault("moe_activations", spelled) != spelled:
                said = f"moe_int8_activations: {str(older).lower()} says moe_activations {spelled}"
                raise ValueError(f"{said}; give one of the two")
        return data

    @model_validator(mode="after")
    def _int8_options_on_the_cpu(self) -> EngineOptions:
        if self.dense_int8 and self.device == "cuda":
            raise ValueError(DENSE_INT8_CPU_ONLY)
        if self.moe_activations in MOE_INT8_CHOICES and (
            self.device == "cuda" or not self.kernels or self.moe != "mxfp4moe"
        ):
            raise ValueError(MOE_INT8_CPU_KERNEL)
        return self

    def full_pages(self) -> int:
        """Pages of the full-attention pool, the scratch page included: at least one longest sequence's."""
        tokens = self.kv_cache_tokens or self.max_batch * self.max_positions
        return max(tokens, self.max_positions) // self.page_size + 2

    def window_pages(self, window: int) -> int:
        """Pages of the sliding-window pool, the scratch page included: each running sequence's window (and the
        page its next token starts), one prompt chunk's reach (one sequence prefills at a time), and an eighth
        of the full pool for the pages the prefix cache keeps."""
        decoding = -(-window // self.page_size) + 2
        chunk = -(-(window + self.prefill_chunk) // self.page_size) + 1
        return self.max_batch * decoding + chunk + self.full_pages() // 8 + 1

    def prefix_budget(self) -> int:
        """Tokens of pages no sequence holds that stay cached: by default the whole pool (allocated anyway)."""
        everything = self.full_pages() * self.page_size
        return everything if self.prefix_cache_tokens is None else min(self.prefix_cache_tokens, everything)


def _demo_checkpoint(cache: Path) -> Path:
    """The random-weight demo model, written once under the cache directory."""
    directory = cache / "random-demo-model"
    if not (directory / "config.json").is_file():
        write_random_checkpoint(directory.with_suffix(".partial"), DEMO_CONFIG, "original", seed=0)
        directory.with_suffix(".partial").rename(directory)
    return directory


def moe_activations(options: EngineOptions, device: str) -> str:
    """The activations the MoE's decode path takes on `device`: `auto` resolved, the others as asked."""
    if options.moe_activations != "auto":
        return options.moe_activations
    kernel = device == "cpu" and options.kernels and options.moe == "mxfp4moe"
    return "int8x2" if kernel else "float"


def _progress(step: int, total: int) -> None:
    log.info("engine_graph_build", done=step, total=total)


class EngineBackend:
    def __init__(self, options: EngineOptions, encoding: HarmonyEncoding) -> None:
        self.options = options
        self.capabilities = Capabilities(
            context_length=options.max_positions,
            constraints=True,
            logprobs=True,
            prefix_cache=options.prefix_budget() > 0,
            service_tiers=True,
        )
        self._encoding = encoding
        self.page_events = PageEvents()  # the pages its prefix cache names (an engine server publishes them)
        self._batcher: Batcher | None = None
        self._grammars: GrammarCompiler | None = None
        self._failure: str | None = None
        self._placement: dict[str, str] = {}
        self._loaded = threading.Event()
        self._load_watchers: set[asyncio.Event] = set()  # set when a request arrives or ends (watch_load)
        threading.Thread(target=self._load, name="gpt-oss-engine-load", daemon=True).start()

    def _load(self) -> None:
        options = self.options
        cache = Path(options.cache_dir) if options.cache_dir else default_cache_dir()
        try:
            if options.checkpoint is None:
                path = _demo_checkpoint(cache)
                log.warning("engine_random_model", checkpoint=str(path), note="NO MODEL CONFIGURED: output is noise")
                print(RANDOM_MODEL_WARNING, file=sys.stderr)
            else:
                path = Path(options.checkpoint)
            checkpoint = Checkpoint(path)
            if checkpoint.config.vocab_size < LAST_SPECIAL:
                raise CheckpointError(
                    f"{path}: vocab_size {checkpoint.config.vocab_size} cannot hold the Harmony special tokens "
                    f"(gpt-oss has {LAST_SPECIAL})"
                )
            self._grammars = GrammarCompiler(self._encoding, checkpoint.config.vocab_size)
            device = resolve_device(options.device, options.device_id)
            dtype = options.dtype or ("bfloat16" if device == "cuda" else "float32")
            if device == "cpu" and dtype == "bfloat16":
                raise EngineDeviceError("dtype bfloat16 needs the cuda device (ONNX Runtime has no CPU bf16 attention)")
            if options.moe == "qmoe" and (reason := qmoe_unsupported_reason(device, dtype)):
                raise EngineDeviceError(reason)
            if options.dense_int8 and device != "cpu":
                raise EngineDeviceError(DENSE_INT8_CPU_ONLY)
            if options.moe_activations in MOE_INT8_CHOICES and device != "cpu":
                raise EngineDeviceError(MOE_INT8_CPU_KERNEL)
            self._placement = {"device": device, "dtype": dtype, "moe": options.moe}
            log.info("engine_device", device=device, dtype=dtype, asked=options.device, moe=options.moe)
            # DenseBF16 runs on the CPU alone: a CUDA graph keeps its dense weights for MatMul
            cpu = device == "cpu"
            graph_options = GraphOptions(
                options.max_positions,
                dtype,
                options.moe,
                dense_bf16=cpu,
                dense_int8=cpu and options.dense_int8,
                moe_int8_pieces=MOE_INT8_PIECES[moe_activations(options, device)],
                page_size=options.page_size,
            )
            model = compiled_model(checkpoint, graph_options, cache, _progress)
            choice = kernel_choice() if options.kernels else None  # the MoE (unless qmoe), the sampler, dense
            kernels = None if choice is None else choice.path
            if cpu:
                self._placement["cpu_kernels"] = "none" if choice is None else choice.variant
                self._placement["moe_activations"] = moe_activations(options, device)
            elif kernels is not None:  # the kernels' tuned launch choices for this GPU
                gpu = moe_tuning.cuda_gpu(options.device_id)
                if options.moe != "qmoe":
                    self._placement["moe_variants"] = moe_tuning.apply(checkpoint.config.num_experts, gpu)
                self._placement["attention_splits"] = attention_tuning.apply(gpu)
            window = checkpoint.config.sliding_window
            pools = KvPools(options.full_pages(), options.window_pages(window), options.page_size, window)
            runtime = DecoderRuntime(
                str(model),
                checkpoint.config,
                options.max_batch + 1,  # the decode rows and a prefill chunk
                options.max_positions,
                pools.full.pages,
                pools.window.pages,
                options.page_size,
                options.threads,
                kernels,
                device=device,
                device_id=options.device_id,
                dtype=dtype,
                cuda_graph=options.cuda_graph,
                spinning=options.spinning,
            )
            self._placement["sampler"] = "kernel" if runtime.samples_on_device else "numpy"
            self._batcher = Batcher(
                runtime,
                pools,
                options.max_batch,
                options.prefill_chunk,
                options.prefix_budget(),
                self.page_events,
                options.prefill_piece_ms / 1000,
            )
            log.info(
                "engine_ready",
                layout=checkpoint.layout,
                kv_bytes=runtime.kv_bytes,
                kv_pages={"full": pools.full.pages - 1, "window": pools.window.pages - 1},
                max_batch=options.max_batch,
                moe="ONNX Runtime QMoE" if options.moe == "qmoe" else "compiled kernel" if kernels else "pure ONNX",
                device=device,
                dtype=dtype,
                cpu_kernels=self._placement.get("cpu_kernels"),
                moe_activations=self._placement.get("moe_activations"),
            )
        except (CheckpointError, OSError, RuntimeError, ValueError) as exc:
            self._failure = str(exc) or type(exc).__name__
            log.error("engine_load_failed", error=str(exc))
        finally:
            self._loaded.set()

    async def ready(self) -> bool:
        return self._batcher is not None and self._batcher.failure is None

    def describe(self) -> dict[str, str]:
        """Where the engine runs (device, dtype), or why it could not load or stopped; for /readyz."""
        if self._failure is not None:
            return {"status": "failed", "error": self._failure}
        if self._batcher is not None and self._batcher.failure is not None:
            return {"status": "stopped", "error": str(self._batcher.failure)}
        return {"status": "ready" if self._batcher is not None else "loading", **self._placement}

    def engine_stats(self) -> EngineStats | None:
        return None if self._batcher is None else self._batcher.stats()

    def host_costs(self) -> HostCosts | None:
        """What the host has spent around the device's work, as of the engine's last step (host_costs.py); None
        before loading."""
        return None if self._batcher is None else self._batcher.host_costs

    def watch_load(self) -> asyncio.Event:
        """An event set whenever a request is submitted here or ends (on the event loop's thread), so that the
        load is published at once; `unwatch_load` when done."""
        event = asyncio.Event()
        self._load_watchers.add(event)
        return event

    def unwatch_load(self, event: asyncio.Event) -> None:
        self._load_watchers.discard(event)

    def _load_changed(self) -> None:
        for event in self._load_watchers:
            event.set()

    def engine_load(self) -> ServerLoad:
        """Sequences running and waiting, and the prompt tokens they have left to run; none before the model is
        loaded."""
        return ServerLoad(0, 0) if self._batcher is None else self._batcher.load()

    async def _runtime(self) -> tuple[Batcher, GrammarCompiler]:
        if not self._loaded.is_set():
            await asyncio.get_running_loop().run_in_executor(None, self._loaded.wait)
        if self._batcher is None or self._grammars is None:
            raise BackendError(f"The model could not be loaded: {self._failure}")
        return self._batcher, self._grammars

    async def generate(self, request: GenerateRequest) -> AsyncIterator[Chunk]:
        batcher, grammars = await self._runtime()
        if len(request.prompt) >= self.options.max_positions:
            raise BackendError(f"The prompt ({len(request.prompt)} tokens) exceeds the model's context.")
        loop = asyncio.get_running_loop()
        guide = None
        if not request.constraint.is_free:
            guide = await loop.run_in_executor(None, _guide, grammars, request)
        arrivals: asyncio.Queue[Chunk | BaseException | None] = asyncio.Queue()
        seed = request.sampling.seed
        penalized = request.sampling.presence_penalty or request.sampling.frequency_penalty
        sequence = Sequence(
            request,
            lambda item: loop.call_soon_threadsafe(arrivals.put_nowait, item),
            np.random.default_rng(seed),
            namespace=namespace_of(request.tenant, request.cache_key, self.options.prefix_cache_scope == "shared"),
            guide=guide,
            counts=_text_counts(request.continues) if penalized else {},
        )
        submitted = time.time_ns()
        batcher.submit(sequence)
        self._load_changed()
        first_token = 0
        try:
            while True:
                item = await arrivals.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise BackendError(f"The engine failed: {item}")
                if not first_token:
                    item.cached_tokens = sequence.reused
                    first_token = time.time_ns()
                yield item
        finally:
            sequence.cancelled.set()  # frees its pages before the next step, or drops it from the queue
            self._load_changed()
            _trace_phases(request.trace_context, sequence, submitted, first_token)

    async def aclose(self) -> None:
        if self._batcher is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._batcher.close)


def _guide(grammars: GrammarCompiler, request: GenerateRequest) -> TokenGuide:
    """The constraint's grammar for the request, past the answer tokens it continues from."""
    guide = grammars.guide(request.constraint, request.max_new_tokens + len(request.continues), request.tenant)
    try:
        for token in request.continues:
            guide.accept(token)
    except RuntimeError as exc:
        raise BackendError(f"The answer to continue does not match its constraint: {exc}") from None
    return guide


def _text_counts(tokens: tuple[int, ...]) -> dict[int, int]:
    """How often each text token occurs in `tokens` (what the penalties count)."""
    counts: dict[int, int] = {}
    for token in tokens:
        if token < FIRST_SPECIAL:
            counts[token] = counts.get(token, 0) + 1
    return counts


def _trace_phases(carrier: dict[str, str], sequence: Sequence, submitted: int, first_token: int) -> None:
    """The sequence's queue wait, prefill and decode as spans under the generation's (when traced), from the
    times the engine thread and this coroutine noted."""
    if not carrier:
        return
    parent = propagate.extract(carrier)
    if not trace.get_current_span(parent).get_span_context().trace_flags.sampled:
        return  # a trace that is not kept
    ended = time.time_ns()
    placed = sequence.placed_ns or ended
    phases = [("engine.queue", submitted, placed, {})]
    if first_token:
        phases.append(("engine.prefill", placed, first_token, {"gateway.cached_tokens": sequence.reused}))
        phases.append(("engine.decode", first_token, ended, {"gen_ai.usage.output_tokens": sequence.generated}))
    for name, start, end, attributes in phases:
        tracer.start_span(name, context=parent, start_time=start, attributes=attributes).end(end_time=end)


def from_options(options: dict[str, Any], encoding: HarmonyEncoding) -> EngineBackend:
    parsed = parse_options(EngineOptions, options, "onnx")
    if parsed.checkpoint is not None and not Path(parsed.checkpoint).is_dir():
        raise ValueError(f"onnx backend: options.checkpoint: {parsed.checkpoint} is not a directory")
    if parsed.device == "cuda" and (reason := cuda_unavailable_reason(parsed.device_id)):
        raise ValueError(f"onnx backend: options.device: cuda was asked for, but {reason}")  # stops the start
    if parsed.moe == "qmoe":  # what the options alone rule out; the device `auto` resolves to is checked at load
        reason = qmoe_unsupported_reason("cpu" if parsed.device == "cpu" else "cuda", parsed.dtype or "bfloat16")
        if reason is not None:
            raise ValueError(f"onnx backend: options.{reason}")
    return EngineBackend(parsed, encoding)
