"""One response being produced: its request, prompt and generation, and the objects made of them (the
response, its stored record)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import structlog

from state import StoredResponse, StoreUnavailable
from state.conversations import ConversationFull

from ..generation.assembler import OutputItem
from ..generation.cot_recovery import index_cot
from ..generation.dialog import Entry
from ..generation.loop import Generation
from ..generation.turn import Outcome
from ..limits import MAX_HISTORY_MESSAGES
from ..services import Services
from ..tenants.admission import Ticket
from ..usage.billing import bill, responses_record
from .models.request import ResponsesRequest
from .record_keeper import RecordKeeper
from .shape import item_json, response_json, usage

NOT_OFFERED_HEADER = "X-Gateway-Tools-Not-Offered"

log = structlog.get_logger("gateway.responses")

TERMINAL = ("completed", "incomplete", "failed", "cancelled")


@dataclass(slots=True, kw_only=True)
class Job:
    """One response being produced: the request, its prompt, and what the turn has made of it so far."""

    services: Services
    request: ResponsesRequest
    tenant: str
    response_id: str
    created_at: int
    dialog: list[Entry]
    input_items: list[dict[str, Any]]
    generation: Generation
    request_id: str
    ticket: Ticket
    keeper: RecordKeeper
    not_offered: list[str] = field(default_factory=list)  # hosted tool types left out of the prompt
    conversation_id: str | None = None
    key_id: str | None = None  # the API key's, for the usage ledger
    service_tier: str = "default"  # the tier applied: echoed and billed
    sealed: dict[str, str] = field(default_factory=dict)
    billed: bool = False

    @property
    def headers(self) -> dict[str, str]:
        headers = {"X-Request-ID": self.request_id}
        if self.not_offered:
            headers[NOT_OFFERED_HEADER] = ", ".join(dict.fromkeys(self.not_offered))
        return headers

    @property
    def first_status(self) -> str:
        return "queued" if self.request.background else "in_progress"

    def seal(self, item: OutputItem) -> str | None:
        if "reasoning.encrypted_content" not in self.request.include:
            return None
        if item.id not in self.sealed:
            self.sealed[item.id] = self.services.sealer.seal(self.tenant, item.text)
        return self.sealed[item.id]

    def response(self, status: str, outcome: Outcome | None = None) -> dict[str, Any]:
        generation = self.generation
        finished = status in TERMINAL
        assembler = generation.assembler
        return response_json(
            self.request,
            response_id=self.response_id,
            created_at=self.created_at,
            status=status,
            output=[item_json(item, self.seal, ended=True) for item in assembler.items] if finished else [],
            usage=usage(
                generation.prompt_tokens, generation.cached_tokens, assembler.output_tokens, assembler.reasoning_tokens
            )
            if finished
            else None,
            stored=self.request.store and self.keeper.stored,
            conversation_id=self.conversation_id,
            outcome=outcome,
            service_tier=self.service_tier,
        )

    def record(self, response: dict[str, Any]) -> StoredResponse:
        conversation = [entry.to_data() for entry in (*self.dialog, *self.generation.assembler.entries)]
        return StoredResponse(
            id=self.response_id,
            tenant=self.tenant,
            created_at=self.created_at,
            response=response,
            conversation=conversation[-MAX_HISTORY_MESSAGES:],
            input_items=self.input_items,
            client_metadata=self.request.client_metadata or {},
        )

    async def bill(self, response: dict[str, Any]) -> None:
        """Put the final response's usage on the ledger (once), before the client hears the end."""
        if not self.billed:
            self.billed = True
            await bill(self.services, responses_record(self.tenant, self.key_id, response, self.created_at))

    async def save_running(self, status: str) -> None:
        """Store the queued or in-progress response under a lease (when asked to store it at all)."""
        if self.request.store:
            await self.keeper.save_running(self.record(self.response(status)))

    async def store_final(self, response: dict[str, Any]) -> StoredResponse | None:
        """Save the final response; when the store is down and a running record waits for it, the record
        to keep retrying (the client hears `store: false` now; a background response's record, which
        nobody has seen, keeps `store: true`)."""
        if not self.request.store:
            return None
        record = self.record(response)
        if await self.keeper.save_final(record):
            response["store"] = self.keeper.stored
            if self.keeper.stored:
                await self._index_cot()
            return None
        pending = self.record({**response, "store": self.request.background})
        response["store"] = False
        return pending

    async def store_later(self, pending: StoredResponse | None) -> None:
        """Retry a final save that found the store down until it lands (see RecordKeeper)."""
        if pending is not None and await self.keeper.save_until_stored(pending):
            await self._index_cot()

    async def extend_conversation(self, status: str) -> None:
        """A finished (or cut-short) response adds its input and output items to its conversation."""
        if self.conversation_id is None or status not in ("completed", "incomplete"):
            return
        output = [item_json(item, ended=True) for item in self.generation.assembler.items]
        try:
            kept = await self.services.conversations.append(
                self.tenant, self.conversation_id, [*self.input_items, *output]
            )
        except (StoreUnavailable, ConversationFull) as exc:
            log.warning("conversation_not_extended", response_id=self.response_id, error=type(exc).__name__)
            return
        if not kept:
            log.info("conversation_gone", response_id=self.response_id)

    async def _index_cot(self) -> None:
        if not self.keeper.deleted:
            assembler = self.generation.assembler
            await index_cot(self.services.store, self.tenant, assembler.items, assembler.entries, self.response_id)
