"""What came before a Responses request, as one value: the previous response's dialog and output items
(`previous_response_id`) or the conversation's items (`conversation`, never both). A create and an
input_tokens count load it the same way, so both see the same prompt."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter, ValidationError

from state import StoredResponse, StoreUnavailable

from ..conversations.items import conversation_items
from ..errors import ApiError, invalid, not_found, unavailable
from ..generation.dialog import Entry
from ..services import Services
from .job import TERMINAL
from .models.items import InputItem, MessageInput
from .models.request import ResponsesRequest

STORED_ITEMS = TypeAdapter(list[InputItem])


@dataclass(frozen=True, slots=True)
class History:
    dialog: list[Entry] = field(default_factory=list)  # the previous response's, its chain of thought included
    previous_output: list[dict[str, Any]] = field(default_factory=list)  # what its tools listed, where they ran
    earlier_items: list[InputItem] = field(default_factory=list)  # the conversation's, before this input

    def with_input(self, req: ResponsesRequest) -> ResponsesRequest:
        """The request whose input is the conversation's items, then its own (what the prompt is built from)."""
        if not self.earlier_items:
            return req
        own = [MessageInput(role="user", content=req.input)] if isinstance(req.input, str) else req.input
        return req.model_copy(update={"input": [*self.earlier_items, *own]})


async def load_history(
    services: Services, tenant: str, req: ResponsesRequest, held: Mapping[str, StoredResponse] | None = None
) -> History:
    """`held`: a WebSocket's own responses (kept for its continuations even with store: false), found first."""
    if req.conversation_id is not None:
        if req.previous_response_id is not None:
            raise invalid("conversation", "conversation and previous_response_id cannot be used together.")
        return History(earlier_items=await _conversation(services, tenant, req.conversation_id))
    if req.previous_response_id is None:
        return History()
    record = (held or {}).get(req.previous_response_id)
    if record is None:
        # OpenAI's 400 for a continuation that cannot be resolved: Codex and others then send the whole context
        missing = invalid(
            "previous_response_id",
            f"Previous response with id '{req.previous_response_id}' not found.",
            "previous_response_not_found",
        )
        record = await load_record(services, tenant, req.previous_response_id, "previous_response_id", missing)
    status = record.response.get("status")
    if status not in TERMINAL:
        raise invalid("previous_response_id", f"Response '{record.id}' is still {status}; wait for it to finish.")
    output = record.response.get("output")
    dialog = [Entry.from_data(data) for data in record.conversation]
    return History(dialog=dialog, previous_output=output if isinstance(output, list) else [])


async def _conversation(services: Services, tenant: str, conversation_id: str) -> list[InputItem]:
    stored = await conversation_items(services, tenant, conversation_id, "conversation")
    try:
        return STORED_ITEMS.validate_python(stored)
    except ValidationError as exc:
        raise invalid(
            "conversation", f"Conversation '{conversation_id}' holds an item this gateway cannot read."
        ) from exc


async def load_record(
    services: Services, tenant: str, response_id: str, param: str, missing: ApiError | None = None
) -> StoredResponse:
    """The tenant's stored response, else `missing` (by default a 404 naming `param`)."""
    try:
        record = await services.store.load(tenant, response_id)
    except StoreUnavailable as exc:
        raise unavailable("The response store is unavailable; try again.") from exc
    if record is None:
        raise missing or not_found(param, f"Response with id '{response_id}' not found.")
    return record
