"""The Conversations API routes: create, retrieve, update, delete; list, add, retrieve and delete items.

Items are kept as a response's input items are (each with an id); a response created with `conversation`
reads them as its history and, once it completed, appends its input and output items."""

from __future__ import annotations

import time

from aiohttp import web

from state import StoreUnavailable
from state.conversations import StoredConversation

from ..errors import not_found, unavailable
from ..ids import new_id
from ..intake.json_body import read_model
from ..json_out import json_response
from ..pagination import page
from ..responses.input import item_dicts
from ..responses.models.items import UNION_TAGS
from ..services import SERVICES
from ..tenants.tenancy import tenant_of
from .items import UNAVAILABLE, append_items, conversation_items, gone, load_conversation
from .models import ConversationCreate, ConversationUpdate, ItemsCreate


async def create_conversation(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    body = await read_model(request, tenant_of(request), ConversationCreate, UNION_TAGS)
    conversation = StoredConversation(new_id("conv_"), tenant_of(request), int(time.time()), body.metadata or {})
    try:
        await services.conversations.create(conversation, item_dicts(body.items or []))
    except StoreUnavailable as exc:
        raise unavailable(UNAVAILABLE) from exc
    return json_response(conversation.to_api())


async def get_conversation(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    conversation = await load_conversation(services, tenant_of(request), request.match_info["conversation_id"])
    return json_response(conversation.to_api())


async def update_conversation(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    body = await read_model(request, tenant_of(request), ConversationUpdate)
    conversation = await load_conversation(services, tenant_of(request), request.match_info["conversation_id"])
    conversation.metadata = body.metadata
    try:
        updated = await services.conversations.update(conversation)
    except StoreUnavailable as exc:
        raise unavailable(UNAVAILABLE) from exc
    if not updated:
        raise gone(conversation.id)
    return json_response(conversation.to_api())


async def delete_conversation(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    conversation_id = request.match_info["conversation_id"]
    try:
        deleted = await services.conversations.delete(tenant_of(request), conversation_id)
    except StoreUnavailable as exc:
        raise unavailable(UNAVAILABLE) from exc
    if not deleted:
        raise gone(conversation_id)
    return json_response({"id": conversation_id, "object": "conversation.deleted", "deleted": True})


async def list_items(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    conversation_id = request.match_info["conversation_id"]
    items = await conversation_items(services, tenant_of(request), conversation_id, "conversation_id")
    return json_response(page(items, request.query, f"conversation '{conversation_id}'"))


async def add_items(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    body = await read_model(request, tenant_of(request), ItemsCreate, UNION_TAGS)
    conversation_id = request.match_info["conversation_id"]
    items = item_dicts(body.items)
    if not await append_items(services, tenant_of(request), conversation_id, items):
        raise gone(conversation_id)
    first, last = items[0]["id"], items[-1]["id"]
    return json_response({"object": "list", "data": items, "first_id": first, "last_id": last, "has_more": False})


async def get_item(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    conversation_id, item_id = request.match_info["conversation_id"], request.match_info["item_id"]
    items = await conversation_items(services, tenant_of(request), conversation_id, "conversation_id")
    for item in items:
        if item.get("id") == item_id:
            return json_response(item)
    raise not_found("item_id", f"Item '{item_id}' not found in conversation '{conversation_id}'.")


async def delete_item(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    tenant = tenant_of(request)
    conversation_id, item_id = request.match_info["conversation_id"], request.match_info["item_id"]
    conversation = await load_conversation(services, tenant, conversation_id)
    try:
        deleted = await services.conversations.delete_item(tenant, conversation_id, item_id)
    except StoreUnavailable as exc:
        raise unavailable(UNAVAILABLE) from exc
    if not deleted:
        raise not_found("item_id", f"Item '{item_id}' not found in conversation '{conversation_id}'.")
    return json_response(conversation.to_api())


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/conversations", create_conversation)
    app.router.add_get("/v1/conversations/{conversation_id}", get_conversation)
    app.router.add_post("/v1/conversations/{conversation_id}", update_conversation)
    app.router.add_delete("/v1/conversations/{conversation_id}", delete_conversation)
    app.router.add_get("/v1/conversations/{conversation_id}/items", list_items)
    app.router.add_post("/v1/conversations/{conversation_id}/items", add_items)
    app.router.add_get("/v1/conversations/{conversation_id}/items/{item_id}", get_item)
    app.router.add_delete("/v1/conversations/{conversation_id}/items/{item_id}", delete_item)
