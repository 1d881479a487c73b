"""Billing: one usage ledger record per finished response or chat completion (state/usage_ledger.py).

The record is written before the client hears the end (`response.completed`, the completion's body or its
last chunk), within BILL_WAIT_S: a response a client saw complete is on the ledger even if its replica dies
right after. A write the ledger refuses for the moment (Redis away) does not hold the answer back: it is
retried in the background with backoff for up to RETRY_FOR_S, and the ledger keeps one record per response id
whatever the retries (per batch line for the Batch API's lines: a line run again after its replica died is billed
once). Outcomes are counted in `gateway_usage_records_total`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from contextvars import ContextVar
from typing import Any

import structlog

from state import StoreUnavailable
from state.usage_ledger import UsageRecord

from ..services import Services

log = structlog.get_logger("gateway.usage")

BILL_WAIT_S = 2.0
RETRY_FOR_S = 600.0
FIRST_RETRY_S = 0.5
NOT_TOOL_CALLS = {"message", "reasoning"}
# "batch_id/custom_id" while a Batch API line runs (set by the loopback's requests, gateway/app.py)
BATCH_LINE: ContextVar[str | None] = ContextVar("batch_line", default=None)


def responses_record(tenant: str, key_id: str | None, response: dict[str, Any], created_at: float) -> UsageRecord:
    """A Responses API response's record, from the object the client gets."""
    usage = response.get("usage") or {}
    tools: dict[str, int] = {}
    for item in response.get("output") or ():
        kind = item.get("type")
        if kind not in NOT_TOOL_CALLS:
            tools[kind] = tools.get(kind, 0) + 1
    return UsageRecord(
        response_id=response["id"],
        tenant=tenant,
        key_id=key_id,
        api="responses",
        model=response.get("model", ""),
        status=response.get("status", "failed"),
        input_tokens=usage.get("input_tokens", 0),
        cached_tokens=(usage.get("input_tokens_details") or {}).get("cached_tokens", 0),
        output_tokens=usage.get("output_tokens", 0),
        reasoning_tokens=(usage.get("output_tokens_details") or {}).get("reasoning_tokens", 0),
        tool_calls=tools,
        created_at=created_at,
        completed_at=time.time(),
        service_tier=response.get("service_tier") or "default",
    )


def chat_record(
    tenant: str, key_id: str | None, completion_id: str, model: str, status: str, usage: dict[str, Any],
    tool_calls: int, created_at: float, service_tier: str = "default",
) -> UsageRecord:  # fmt: skip
    """A chat completion's record, from the `usage` object the client gets."""
    return UsageRecord(
        response_id=completion_id,
        tenant=tenant,
        key_id=key_id,
        api="chat.completions",
        model=model,
        status=status,
        input_tokens=usage["prompt_tokens"],
        cached_tokens=usage["prompt_tokens_details"]["cached_tokens"],
        output_tokens=usage["completion_tokens"],
        reasoning_tokens=usage["completion_tokens_details"]["reasoning_tokens"],
        tool_calls={"function_call": tool_calls} if tool_calls else {},
        created_at=created_at,
        completed_at=time.time(),
        service_tier=service_tier,
    )


async def bill(services: Services, entry: UsageRecord) -> None:
    """Keep the record now (within BILL_WAIT_S), or keep trying in the background; never raises."""
    if (line := BATCH_LINE.get()) is not None:
        entry = dataclasses.replace(entry, batch_line=line)
    metrics = services.metrics
    ledger = services.ledger
    try:
        if ledger.in_process:  # nothing to wait for: no timer per answer
            kept = await ledger.record(entry)
        else:
            async with asyncio.timeout(BILL_WAIT_S):  # no task of its own: this runs for every answer
                kept = await ledger.record(entry)
    except (StoreUnavailable, TimeoutError):
        metrics.child(metrics.usage_records, "failed").inc()
        task = asyncio.ensure_future(_retry(services, entry))
        services.ledger_retries.add(task)
        task.add_done_callback(services.ledger_retries.discard)
        return
    metrics.child(metrics.usage_records, "kept" if kept else "duplicate").inc()


async def _retry(services: Services, entry: UsageRecord) -> None:
    counter = services.metrics.usage_records
    delay, deadline = FIRST_RETRY_S, time.monotonic() + RETRY_FOR_S
    while time.monotonic() < deadline:
        await asyncio.sleep(delay)
        delay = min(delay * 2, 30.0)
        try:
            kept = await asyncio.wait_for(services.ledger.record(entry), BILL_WAIT_S)
        except (StoreUnavailable, TimeoutError):
            continue
        counter.labels("kept" if kept else "duplicate").inc()
        return
    counter.labels("given_up").inc()
    log.error("usage_record_lost", response_id=entry.response_id, tenant=entry.tenant)
