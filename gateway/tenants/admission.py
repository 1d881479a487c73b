"""Admission against a tenant's rate and concurrency limits; a Ticket settles what a generation used.

Requests per minute and tokens per minute are GCRA rates (burst = one minute's worth). Tokens are
reserved on admission (prompt + every choice's maximum output) and the unused part is refunded when
the generation ends. Concurrency slots are leases renewed while the generation runs. A refusal is a
429 in OpenAI's shape with an exact `Retry-After` (whole seconds, rounded up) and `retry-after-ms`,
which the openai SDK honours. Counters live in Redis when one is configured, so every replica shares
them; when Redis cannot be reached, `on_store_failure` decides (local counting, open, or closed).
"""

from __future__ import annotations

import asyncio
import math
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from state import StoreUnavailable
from state.limiter import Limiter, MemoryLimiter, RateDecision

from ..errors import ApiError, unavailable
from ..observability.tracing import traced
from ..process.task_stop import cancel_and_wait
from .limits import LimitsConfig

log = structlog.get_logger("gateway.admission")


def _rate_limited(kind: str, limit: int, decision: RateDecision) -> ApiError:
    seconds = decision.retry_after_s
    unit = "requests" if kind == "requests" else "tokens"
    message = f"Rate limit reached for {unit} per minute: limit {limit}. Please try again in {seconds:.3f}s."
    headers = {
        "Retry-After": str(max(1, math.ceil(seconds))),
        "retry-after-ms": str(max(1, math.ceil(seconds * 1000))),
        f"x-ratelimit-limit-{unit}": str(limit),
        f"x-ratelimit-remaining-{unit}": str(int(decision.remaining)),
    }
    return ApiError(429, message, code="rate_limit_exceeded", kind=unit, headers=headers)


@dataclass(slots=True)
class _Lease:
    limiter: Limiter
    name: str
    lease_id: str


@dataclass(slots=True)
class Ticket:
    """What one admitted request holds: its token reservation and its concurrency slots."""

    admission: Admission
    tenant: str
    reserved_tokens: int = 0
    tokens_limiter: Limiter | None = None
    leases: list[_Lease] = field(default_factory=list)
    settled: bool = False

    async def settle(self, used_tokens: int) -> None:
        """Refund the unused reservation and free the slots (idempotent)."""
        if self.settled:
            return
        self.settled = True
        await self.admission.settle(self, used_tokens)


class Admission:
    def __init__(
        self, config: LimitsConfig, shared: Limiter | None, on_refused: Callable[[str, str], None] | None = None
    ) -> None:
        self.config = config
        self._shared = shared
        self._on_refused = on_refused or (lambda tenant, limit: None)
        self._local = MemoryLimiter()
        self._active: dict[int, Ticket] = {}
        self._renewer: asyncio.Task[None] | None = None

    async def _counted(self, call):
        """`call(limiter)` on the shared limiter (else the local one), and the limiter that counted it;
        on a Redis failure the configured policy decides: count locally, admit uncounted (None, None), or 503."""
        limiter = self._shared or self._local
        try:
            return await call(limiter), limiter
        except StoreUnavailable:
            policy = self.config.on_store_failure
            log.warning("limits_store_unavailable", policy=policy)
            if policy == "closed":
                raise unavailable("Rate limits cannot be checked right now; try again.") from None
            if policy == "open":
                return None, None
            return await call(self._local), self._local

    @traced("gateway.admission")
    async def admit(
        self,
        tenant: str,
        *,
        prompt_tokens: int,
        max_output_tokens: int,
        choices: int,
        stream: bool,
        background: bool = False,
    ) -> Ticket:
        limits = self.config.for_tenant(tenant)
        ticket = Ticket(self, tenant)
        try:
            if limits.requests_per_minute:
                rpm = limits.requests_per_minute
                decision, _ = await self._counted(lambda lim: lim.charge(tenant, "rpm", rpm, rpm, 1))
                if decision is not None and not decision.admitted:
                    raise self._refused(tenant, "requests", _rate_limited("requests", rpm, decision))
            if limits.tokens_per_minute:
                tpm = limits.tokens_per_minute
                cost = prompt_tokens + choices * max_output_tokens
                if cost > tpm:
                    too_large = ApiError(
                        429,
                        f"Request too large: it may use {cost} tokens (prompt and maximum output) and the limit is "
                        f"{tpm} tokens per minute. Lower max_output_tokens or the prompt.",
                        code="rate_limit_exceeded",
                        kind="tokens",
                    )
                    raise self._refused(tenant, "tokens", too_large)
                decision, used = await self._counted(lambda lim: lim.charge(tenant, "tpm", tpm, tpm, cost))
                if decision is not None and not decision.admitted:
                    raise self._refused(tenant, "tokens", _rate_limited("tokens", tpm, decision))
                if used is not None:
                    ticket.reserved_tokens, ticket.tokens_limiter = cost, used
            if limits.concurrent_requests:
                await self._lease(ticket, "requests", limits.concurrent_requests)
            if stream and limits.concurrent_streams:
                await self._lease(ticket, "streams", limits.concurrent_streams)
            if background and limits.concurrent_background:
                await self._lease(ticket, "background", limits.concurrent_background)
        except BaseException:
            await ticket.settle(0)
            raise
        if ticket.leases:
            self._active[id(ticket)] = ticket
            if self._renewer is None or self._renewer.done():
                self._renewer = asyncio.get_running_loop().create_task(self._renew_leases())
        return ticket

    def _refused(self, tenant: str, limit: str, error: ApiError) -> ApiError:
        self._on_refused(tenant, limit)
        return error

    async def _lease(self, ticket: Ticket, name: str, limit: int) -> None:
        lease_id = secrets.token_hex(8)
        ttl = self.config.lease_ttl_s
        granted, used = await self._counted(lambda lim: lim.lease(ticket.tenant, name, limit, lease_id, ttl))
        if used is None:
            return
        if not granted:
            what = {"requests": "generations", "streams": "streams", "background": "background responses"}[name]
            busy = ApiError(
                429,
                f"Too many concurrent {what} for this API key (limit {limit}); wait for one to finish.",
                code="concurrency_limit_exceeded",
                kind="requests",
                headers={"Retry-After": "1"},
            )
            raise self._refused(ticket.tenant, "concurrency", busy)
        ticket.leases.append(_Lease(used, name, lease_id))

    async def settle(self, ticket: Ticket, used_tokens: int) -> None:
        self._active.pop(id(ticket), None)
        refund = ticket.reserved_tokens - used_tokens
        try:
            if refund > 0 and ticket.tokens_limiter is not None:
                tpm = self.config.for_tenant(ticket.tenant).tokens_per_minute or 1
                await ticket.tokens_limiter.charge(ticket.tenant, "tpm", tpm, tpm, -refund)
            for lease in ticket.leases:
                await lease.limiter.release(ticket.tenant, lease.name, lease.lease_id)
        except StoreUnavailable:
            log.warning("limits_settle_failed", note="slots free when their leases expire")

    async def _renew_leases(self) -> None:
        interval = self.config.lease_ttl_s / 3
        while self._active:
            await asyncio.sleep(interval)
            for ticket in list(self._active.values()):
                for lease in ticket.leases:
                    try:
                        await lease.limiter.renew(ticket.tenant, lease.name, [lease.lease_id], self.config.lease_ttl_s)
                    except StoreUnavailable:
                        log.warning("limits_renew_failed")

    async def aclose(self) -> None:
        if self._renewer is not None:
            await cancel_and_wait([self._renewer], "limit lease renewer")
        if self._shared is not None:
            await self._shared.aclose()
