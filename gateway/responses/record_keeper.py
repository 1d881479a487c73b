"""The stored record of one response while it is produced: its lease, its final save, and DELETE's word.

A streamed or background response is saved as soon as its id is known, with a lease that the keeper
renews while the run lasts (another replica reads a record whose lease ran out as failed). The final
save ends the lease; if the store is down then, it is retried with backoff until it lands or the
record would have expired anyway, and the run (and a drain) waits for it. A save or renewal refused
because the response was deleted stops the run: nothing written later brings a deleted response back.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import structlog

from state import RecordTooLarge, ResponseStore, StoredResponse, StoreUnavailable

log = structlog.get_logger("gateway.record_keeper")

RETRY_FIRST_S = 0.2
RETRY_MAX_S = 5.0
TOO_LARGE = "The response was produced but is too large to store."


@dataclass(slots=True)
class RecordKeeper:
    store: ResponseStore
    tenant: str
    response_id: str
    lease_s: float
    expires_at: float  # wall-clock time past which the record would be gone anyway
    stored: bool = True  # false once a save failed: the client is told `store: false`
    leased: bool = False  # a running record is in the store: it must end in a final save
    deleted: bool = False

    async def save_running(self, record: StoredResponse) -> None:
        """Save a queued or in-progress record with the lease; a failure means it is not stored at all."""
        if not self.stored:
            return
        try:
            if await self.store.save(record, self.lease_s):
                self.leased = True
            else:
                self.deleted = True
        except (StoreUnavailable, RecordTooLarge) as exc:
            log.warning("response_not_stored", response_id=self.response_id, error=type(exc).__name__)
            self.stored = False

    async def save_final(self, record: StoredResponse) -> bool:
        """One attempt at the final save; False when it must be retried (`save_until_stored`)."""
        if not self.stored:
            return True
        try:
            if not await self.store.save(record):
                self.deleted = True
            return True
        except RecordTooLarge:
            log.warning("response_not_stored", response_id=self.response_id, error="RecordTooLarge")
            self.stored = False
            if self.leased:  # the running record must still end: as failed, without the turn
                await self.save_until_stored(_too_large(record))
            return True
        except StoreUnavailable as exc:
            log.warning("final_save_failed", response_id=self.response_id, reason=exc.reason, retrying=self.leased)
            self.stored = False
            return not self.leased

    async def save_until_stored(self, record: StoredResponse) -> bool:
        """Retry the final save with backoff until it lands, is refused (deleted), or the record's expiry."""
        delay = RETRY_FIRST_S
        while time.time() < self.expires_at:
            try:
                if not await self.store.save(record):
                    self.deleted = True
                log.info("final_save_landed", response_id=self.response_id)
                return True
            except StoreUnavailable:
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)
        log.error("final_save_abandoned", response_id=self.response_id)
        return False

    async def renew(self) -> bool:
        """Extend the lease; False when the response was deleted (the run should stop)."""
        if not self.leased:
            return True
        try:
            alive = await self.store.renew(self.tenant, self.response_id, self.lease_s)
        except StoreUnavailable:
            return True  # the final save retries; readers see the record again when the store is back
        if not alive:
            self.deleted = True
        return alive

    async def cancelled_elsewhere(self) -> bool:
        """Whether another replica cancelled the running record (an outage or a lost record says no)."""
        if not self.leased:
            return False
        try:
            record = await self.store.load(self.tenant, self.response_id)
        except StoreUnavailable:
            return False
        return record is not None and record.response.get("status") == "cancelled"


def _too_large(record: StoredResponse) -> StoredResponse:
    response = {
        **record.response,
        "status": "failed",
        "output": [],
        "store": False,
        "error": {"code": "server_error", "message": TOO_LARGE},
    }
    return StoredResponse(record.id, record.tenant, record.created_at, response, [], record.input_items)
