"""Running a Job: its stream events fed to their listeners, its record leased and tended, its final
object stored; in the request, or as a task (streamed and background responses)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import structlog

from ..generation.assembler import ItemEvent
from ..generation.turn import Outcome
from .event_sink import EventSink
from .job import Job
from .runs import EventLog, Run
from .stream_events import StreamEvents

log = structlog.get_logger("gateway.responses")

CANCEL_POLL_S = 1.0


class Feed:
    """The stream events of one response: to its run's log (a streaming client) and, for a background
    response, to the shared event streams (streaming it again later); `Feed.off` when neither wants them."""

    def __init__(self, log: EventLog | None, events: StreamEvents | None, sink: EventSink | None = None) -> None:
        self._log = log
        self._events = events
        self._sink = sink
        self._opened = False

    @classmethod
    def off(cls) -> Feed:
        return cls(None, None)

    def _publish(self, payload: dict[str, Any]) -> None:
        if self._log is not None:
            self._log.publish(payload)
        if self._sink is not None:
            self._sink.publish(payload)

    def open(self, job: Job) -> None:
        """`response.created` and `response.in_progress`, once (building them costs: only with a listener)."""
        if self._events is not None and not self._opened:
            self._opened = True
            self.lifecycle("response.created", job.response(job.first_status))
            self.lifecycle("response.in_progress", job.response("in_progress"))

    def lifecycle(self, kind: str, response: dict[str, Any]) -> None:
        if self._events is not None:
            self._publish(self._events.lifecycle(kind, response))

    def items(self, batch: list[ItemEvent]) -> None:
        if self._events is not None:
            for event in batch:
                for payload in self._events.for_item_event(event):
                    self._publish(payload)

    def error(self, code: str | None, message: str | None) -> None:
        if self._events is not None:
            self._publish(self._events.event("error", code=code, message=message, param=None))

    def cancelled(self) -> None:
        self.error("response_cancelled", "The response was cancelled.")

    def end(self) -> None:
        """The stream's last event is out: its listener may go (the run may still finish storing)."""
        if self._log is not None:
            self._log.close()


async def _tend(job: Job, task: asyncio.Task[None]) -> None:
    """While the run lasts: renew its record's lease, and stop it if another replica deleted or cancelled it."""
    keeper = job.keeper
    renew_every = keeper.lease_s / 3
    poll_s = min(CANCEL_POLL_S, renew_every) if job.request.background else renew_every
    next_renewal = time.monotonic() + renew_every
    while not task.done():
        await asyncio.sleep(poll_s)
        if time.monotonic() >= next_renewal:
            next_renewal = time.monotonic() + renew_every
            if not await keeper.renew():
                task.cancel()
                return
        if job.request.background and await keeper.cancelled_elsewhere():
            task.cancel()
            return


async def run_job(job: Job, feed: Feed) -> dict[str, Any]:
    """Generate to the end (or cancellation), feeding the stream events; return the final object."""
    try:
        return await _generate(job, feed)
    finally:
        generation = job.generation
        await job.ticket.settle(generation.prompt_tokens + generation.assembler.output_tokens)


async def _generate(job: Job, feed: Feed) -> dict[str, Any]:
    if job.request.background:
        if await job.keeper.cancelled_elsewhere():  # cancelled while queued: keep the stored cancellation
            final = job.response("cancelled")
            await job.bill(final)
            feed.cancelled()
            return final
        await job.save_running("in_progress")
        if job.keeper.deleted:  # deleted while queued: nothing to produce
            final = job.response("cancelled")
            await job.bill(final)
            return final
    feed.open(job)
    try:
        async for batch in job.generation.events():
            feed.items(batch)
    except asyncio.CancelledError:
        cancelled = job.response("cancelled")
        await job.bill(cancelled)
        await job.store_final(cancelled)  # one attempt: a cancelled run does not linger
        feed.cancelled()
        raise
    outcome = job.generation.outcome or Outcome("failed", error_code="server_error", error_message="No outcome.")
    if job.request.background and await job.keeper.cancelled_elsewhere():
        outcome = Outcome("cancelled")
    final = job.response(outcome.status, outcome)
    await job.bill(final)
    pending = await job.store_final(final)
    await job.extend_conversation(outcome.status)
    if outcome.status == "cancelled":
        feed.cancelled()
    else:
        if outcome.status == "failed":
            feed.error(outcome.error_code, outcome.error_message)
        feed.lifecycle(f"response.{outcome.status}", final)
    feed.end()
    await job.store_later(pending)
    return final


def start_job(job: Job, stream: bool) -> Run:
    run = Run(job.tenant)
    sink = EventSink(job.services.events, job.tenant, job.response_id) if job.request.background else None
    options = job.request.stream_options
    obfuscate = options is None or options.include_obfuscation is not False
    events = StreamEvents(job.seal, obfuscate, job.services.settings.reasoning_stream_events)
    feed = Feed(run.log if stream else None, events, sink) if stream or sink else Feed.off()

    async def main() -> None:
        tender = None
        if job.keeper.leased:
            tender = asyncio.ensure_future(_tend(job, asyncio.current_task()))  # type: ignore[arg-type]
        try:
            await run_job(job, feed)
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("response_run_failed", response_id=job.response_id)
            failure = Outcome("failed", error_code="server_error", error_message="Internal error.")
            final = job.response("failed", failure)
            await job.bill(final)
            pending = await job.store_final(final)
            feed.lifecycle("response.failed", final)
            feed.end()
            await job.store_later(pending)
        finally:
            if tender is not None:
                tender.cancel()
            if sink is not None:
                await sink.close()
            run.log.close()
            job.services.runs.remove(job.response_id)

    if not job.request.background:  # nothing to check first: the stream's first events go out with its head
        feed.open(job)
    lifecycle = job.services.lifecycle
    lifecycle.enter()  # counted from now (a drain cannot miss it) until the task is done, even if never started
    run.task = asyncio.ensure_future(main())
    run.task.add_done_callback(lambda _: lifecycle.leave())
    job.services.runs.add(job.response_id, run)
    return run
