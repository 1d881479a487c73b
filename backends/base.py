"""The Backend protocol: prompt token ids in, an async stream of generated token ids out."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class Sampling:
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None


@dataclass(slots=True)
class GenerateRequest:
    prompt: list[int]
    max_new_tokens: int
    stop_ids: tuple[int, ...]
    request_id: str
    sampling: Sampling = field(default_factory=Sampling)


@dataclass(slots=True)
class Chunk:
    tokens: list[int]


@dataclass(frozen=True, slots=True)
class Capabilities:
    context_length: int
    constraints: bool = False
    logprobs: bool = False


@runtime_checkable
class Backend(Protocol):
    """Backends never see API objects; cancelling the iterator cancels the generation."""

    capabilities: Capabilities

    def generate(self, request: GenerateRequest) -> AsyncIterator[Chunk]: ...

    async def aclose(self) -> None: ...
