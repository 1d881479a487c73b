"""Every replica's batch runner: it claims batches nobody runs, checks their lines, runs them at the `flex` tier
and writes their output and error files.

A replica runs at most GATEWAY_BATCH_RUNNING_PER_REPLICA batches, each with GATEWAY_BATCH_LINES_IN_FLIGHT lines
at once, each line sent as its tenant through the loopback (so the tenant's limits, billing and traces apply,
and the engine serves it only on capacity that priority and default traffic leave). The lease on a batch is
renewed every third of GATEWAY_BATCH_LEASE_S; a replica that dies stops renewing, and another takes the batch up
after the lease, running only the lines with no kept result (state/batches.py). A line refused for the moment
(429, 503) is retried with backoff until the batch's window ends; any other answer is its result, kept once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

import aiohttp
import structlog

from state import StoreUnavailable
from state.batches import TERMINAL
from state.files import StoredFile

from ..ids import new_id
from ..process.task_stop import cancel_and_wait
from ..services import Services
from .batches_api import KEY_ID, OUTPUT_EXPIRY
from .lines import BatchLine, answer_line, failed_line, parse_lines, succeeded, usage_of
from .loopback import Loopback

log = structlog.get_logger("gateway.batches")

RETRY_STATUSES = frozenset({429, 503})
FIRST_RETRY_S, MAX_RETRY_S = 0.5, 30.0
PROGRESS_EVERY_S = 1.0


def _refusal(param: str, message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": "invalid_value"}}


class _Cut(Exception):
    """The batch stops starting lines: cancelled, expired, its lease lost, or the replica stopping."""


class BatchRunner:
    def __init__(self, services: Services, loopback: Loopback) -> None:
        self._services = services
        self._settings = services.settings
        self._loopback = loopback
        self._owner = new_id("runner_")
        self._running: dict[tuple[str, str], asyncio.Task[None]] = {}  # each batch's holder (_hold)
        self._work: dict[tuple[str, str], asyncio.Task[None]] = {}  # and the task running its lines (_run)
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._look_for_work())

    async def stop(self) -> None:
        self._stopping = True  # the search ends at its next turn, even where the cancel below is lost
        tasks = [t for t in (self._task, *self._running.values(), *self._work.values()) if t is not None]
        await cancel_and_wait(tasks, "batch runner")

    async def _look_for_work(self) -> None:
        while not self._stopping:
            try:
                await self._claim_some()
            except StoreUnavailable as exc:
                log.warning("batch_store_unavailable", reason=exc.reason)
            await asyncio.sleep(self._settings.batch_poll_s)

    async def _claim_some(self) -> None:
        store = self._services.batches
        for key in await store.unfinished():
            if self._stopping or len(self._running) >= self._settings.batch_running_per_replica:
                return
            if key in self._running or not await store.claim(*key, self._owner, self._settings.batch_lease_s):
                continue
            if self._stopping:  # stopped while claiming: the batch is left to another replica
                await store.release(*key, self._owner)
                return
            task = asyncio.ensure_future(self._hold(*key))
            self._running[key] = task
            task.add_done_callback(lambda _, key=key: self._running.pop(key, None))

    async def _hold(self, tenant: str, batch_id: str) -> None:
        """Run the batch while renewing its lease; give it up when the lease is lost."""
        store = self._services.batches
        work = asyncio.ensure_future(self._run(tenant, batch_id))
        self._work[tenant, batch_id] = work
        try:
            while not work.done():
                await asyncio.wait([work], timeout=self._settings.batch_lease_s / 3)
                if not work.done() and not await store.claim(
                    tenant, batch_id, self._owner, self._settings.batch_lease_s
                ):
                    log.warning("batch_lease_lost", batch_id=batch_id)
                    await cancel_and_wait([work], "batch whose lease was lost")
            await work
        except StoreUnavailable as exc:
            log.warning("batch_store_unavailable", reason=exc.reason, batch_id=batch_id)
        except Exception:
            log.exception("batch_failed", batch_id=batch_id)
        finally:
            work.cancel()
            with contextlib.suppress(BaseException):
                await work
            self._work.pop((tenant, batch_id), None)
            with contextlib.suppress(StoreUnavailable, asyncio.CancelledError):
                await store.release(tenant, batch_id, self._owner)

    async def _run(self, tenant: str, batch_id: str) -> None:
        store = self._services.batches
        batch = await store.load(tenant, batch_id)
        if batch is None or batch["status"] in TERMINAL:
            return
        content = await self._input(tenant, batch["input_file_id"])
        if content is None:
            await self._fail(tenant, batch, "file_not_found", "The input file was deleted before the batch ran.")
            return
        settings = self._settings
        lines, errors = await self._services.costly.run(
            tenant, lambda: parse_lines(content, batch["endpoint"], settings.batch_max_lines)
        )
        if errors:
            batch["errors"] = {"object": "list", "data": errors}
            await self._fail(tenant, batch, None, None)
            return
        if batch["status"] == "validating":
            batch.update(status="in_progress", in_progress_at=int(time.time()), model=lines[0].body["model"])
            batch["request_counts"]["total"] = len(lines)
            await self._save(tenant, batch)
        results = await store.results(tenant, batch_id)
        _set_counts(batch, lines, results)
        pending = [line for line in lines if line.number not in results]
        await self._run_lines(tenant, batch, lines, pending)
        await self._finish(tenant, batch, lines)

    async def _input(self, tenant: str, file_id: str) -> bytes | None:
        files = self._services.files
        file = await files.load(tenant, file_id)
        if file is None:
            return None
        return b"".join([chunk async for chunk in files.content(tenant, file)])

    async def _run_lines(
        self, tenant: str, batch: dict[str, Any], lines: list[BatchLine], pending: list[BatchLine]
    ) -> None:
        queue = list(reversed(pending))
        progress_at = time.monotonic()

        async def worker() -> None:
            nonlocal progress_at
            while queue:
                line = queue.pop()
                await self._check_going(tenant, batch)
                await self._run_line(tenant, batch, line)
                if time.monotonic() - progress_at > PROGRESS_EVERY_S:
                    progress_at = time.monotonic()
                    await self._save(tenant, batch)

        try:
            async with asyncio.TaskGroup() as group:
                for _ in range(self._settings.batch_lines_in_flight):
                    group.create_task(worker())
        except* _Cut:
            pass

    async def _check_going(self, tenant: str, batch: dict[str, Any]) -> None:
        if await self._services.batches.cancel_requested(tenant, batch["id"]) is not None:
            raise _Cut
        if time.time() >= batch["expires_at"]:
            raise _Cut

    async def _run_line(self, tenant: str, batch: dict[str, Any], line: BatchLine) -> None:
        """Send the line until it has an answer (refusals for the moment retried), and keep that answer once."""
        if line.body.get("stream"):
            result = answer_line(line.custom_id, 400, "", _refusal("body.stream", "Batch requests cannot stream."))
        elif line.body.get("background"):
            message = "Batch requests cannot run in the background."
            result = answer_line(line.custom_id, 400, "", _refusal("body.background", message))
        else:
            result = await self._send(tenant, batch, line)
        if await self._services.batches.keep_result(tenant, batch["id"], line.number, result):
            batch["request_counts"]["completed" if succeeded(result) else "failed"] += 1

    async def _send(self, tenant: str, batch: dict[str, Any], line: BatchLine) -> dict[str, Any]:
        delay = FIRST_RETRY_S
        while True:
            left = batch["expires_at"] - time.time()
            if left <= 0:
                raise _Cut
            try:
                status, request_id, body = await self._loopback.post(
                    tenant, batch.get(KEY_ID), f"{batch['id']}/{line.custom_id}", batch["endpoint"], line.body, left
                )
            except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError):
                status, request_id, body = 503, "", None
            if status not in RETRY_STATUSES:
                return answer_line(line.custom_id, status, request_id, body)
            await asyncio.sleep(delay)
            await self._check_going(tenant, batch)
            delay = min(delay * 2, MAX_RETRY_S)

    async def _save(self, tenant: str, batch: dict[str, Any]) -> None:
        """Keep the object; a cancel flagged meanwhile shows as `cancelling` until the batch ends."""
        cancelled_at = await self._services.batches.cancel_requested(tenant, batch["id"])
        if cancelled_at is not None and batch["status"] in ("validating", "in_progress"):
            batch.update(status="cancelling", cancelling_at=cancelled_at)
        await self._services.batches.save(tenant, batch)

    async def _fail(self, tenant: str, batch: dict[str, Any], code: str | None, message: str | None) -> None:
        if code is not None:
            batch["errors"] = {
                "object": "list",
                "data": [{"code": code, "message": message, "param": None, "line": None}],
            }
        batch.update(status="failed", failed_at=int(time.time()))
        await self._services.batches.save(tenant, batch)

    async def _finish(self, tenant: str, batch: dict[str, Any], lines: list[BatchLine]) -> None:
        """Write the output and error files from the kept results and end the batch: completed; cancelled (the
        lines that never ran are left out); or expired (they are in the error file, as `batch_expired`)."""
        store = self._services.batches
        cancelled_at = await store.cancel_requested(tenant, batch["id"])
        batch.update(status="finalizing", finalizing_at=int(time.time()))
        await self._save(tenant, batch)
        results = await store.results(tenant, batch["id"])
        _set_counts(batch, lines, results)
        unrun = [line for line in lines if line.number not in results]
        expired = bool(unrun) and cancelled_at is None
        answered = [
            results[line.number] for line in lines if line.number in results and succeeded(results[line.number])
        ]
        failed = [
            results[line.number] for line in lines if line.number in results and not succeeded(results[line.number])
        ]
        if expired:
            message = "This request could not be executed before the completion window expired."
            failed += [failed_line(line.custom_id, "batch_expired", message) for line in unrun]
            batch["request_counts"]["failed"] += len(unrun)
        batch["usage"] = usage_of(answered)
        if answered:
            batch["output_file_id"] = await self._write(tenant, batch, "output", answered)
        if failed:
            batch["error_file_id"] = await self._write(tenant, batch, "error", failed)
        now = int(time.time())
        if cancelled_at is not None:
            batch.update(status="cancelled", cancelled_at=now, cancelling_at=cancelled_at)
        elif expired:
            batch.update(status="expired", expired_at=now)
        else:
            batch.update(status="completed", completed_at=now)
        await store.save(tenant, batch)
        log.info("batch_ended", batch_id=batch["id"], status=batch["status"], **batch["request_counts"])

    async def _write(self, tenant: str, batch: dict[str, Any], kind: str, results: list[dict[str, Any]]) -> str:
        content = b"".join(json.dumps(result, separators=(",", ":")).encode() + b"\n" for result in results)
        now = int(time.time())
        lifetime = batch.get(OUTPUT_EXPIRY)
        file = StoredFile(new_id("file-"), tenant, f"{batch['id']}_{kind}.jsonl", "batch_output", len(content), now,
                          now + lifetime if lifetime else None)  # fmt: skip
        await self._services.files.put(file, content, budgeted=False)
        return file.id


def _set_counts(batch: dict[str, Any], lines: list[BatchLine], results: dict[int, dict[str, Any]]) -> None:
    """`request_counts` from the kept results (read once at pickup and at the end; lines kept meanwhile add one)."""
    done = [results[line.number] for line in lines if line.number in results]
    ok = sum(1 for result in done if succeeded(result))
    batch["request_counts"] = {"total": len(lines), "completed": ok, "failed": len(done) - ok}
