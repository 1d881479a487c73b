"""A conversation's items in the store, for the Conversations API routes and for responses that continue
a conversation: read them, add to them, each failure an OpenAI-shaped error."""

from __future__ import annotations

from typing import Any

from state import StoreUnavailable
from state.conversations import ConversationFull, StoredConversation

from ..errors import invalid, not_found, unavailable
from ..services import Services

UNAVAILABLE = "The conversation store is unavailable; try again."


def gone(conversation_id: str) -> Exception:
    return not_found("conversation_id", f"Conversation with id '{conversation_id}' not found.")


async def load_conversation(services: Services, tenant: str, conversation_id: str) -> StoredConversation:
    try:
        conversation = await services.conversations.load(tenant, conversation_id)
    except StoreUnavailable as exc:
        raise unavailable(UNAVAILABLE) from exc
    if conversation is None:
        raise gone(conversation_id)
    return conversation


async def conversation_items(services: Services, tenant: str, conversation_id: str, param: str) -> list[dict[str, Any]]:
    """Every item of the conversation, in order; a 404 naming `param` when it does not exist."""
    try:
        items = await services.conversations.items(tenant, conversation_id)
    except StoreUnavailable as exc:
        raise unavailable(UNAVAILABLE) from exc
    if items is None:
        raise not_found(param, f"Conversation with id '{conversation_id}' not found.")
    return items


async def append_items(services: Services, tenant: str, conversation_id: str, items: list[dict[str, Any]]) -> bool:
    """Add items at the end; False when the conversation was deleted meanwhile."""
    try:
        return await services.conversations.append(tenant, conversation_id, items)
    except ConversationFull as exc:
        raise invalid("items", "The conversation is full: it holds as many items as a conversation can.") from exc
    except StoreUnavailable as exc:
        raise unavailable(UNAVAILABLE) from exc
