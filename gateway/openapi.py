"""The OpenAPI 3.1 document of the API, generated from the pydantic request and response models."""

from __future__ import annotations

from functools import cache
from typing import Any

from aiohttp import web
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from .batches.openapi_paths import batch_models, batch_paths
from .chat.models import ChatRequest
from .conversations.models import ConversationCreate, ConversationUpdate, ItemsCreate
from .json_out import json_response
from .responses.models.request import ResponsesRequest
from .responses.shape import DeletedResponse, InputItemList, ResponseObject

_REF = "#/components/schemas/{model}"
_ERROR = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {k: {"type": ["string", "null"]} for k in ("message", "type", "param", "code")},
            "required": ["message", "type", "param", "code"],
        }
    },
    "required": ["error"],
}


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": _REF.format(model=model.__name__)}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors() -> dict[str, Any]:
    error = {"$ref": _REF.format(model="Error")}
    return {
        "400": _json(error, "Invalid request; `param` names the offending parameter"),
        "404": _json(error, "Not found (or owned by another tenant)"),
        "413": _json(error, "Request body too large"),
        "503": _json(error, "The response store is unavailable"),
    }


_MODEL = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "object": {"const": "model"},
        "created": {"type": "integer"},
        "owned_by": {"type": "string"},
        "context_length": {"type": "integer"},
    },
    "required": ["id", "object", "created", "owned_by"],
}
_MODEL_LIST = {
    "type": "object",
    "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": _MODEL}},
}


def _list_of(item: dict[str, Any]) -> dict[str, Any]:
    """A page of a list endpoint (gateway/pagination.py's shape)."""
    return {
        "type": "object",
        "properties": {
            "object": {"const": "list"},
            "data": {"type": "array", "items": item},
            "first_id": {"type": ["string", "null"]},
            "last_id": {"type": ["string", "null"]},
            "has_more": {"type": "boolean"},
        },
        "required": ["object", "data", "first_id", "last_id", "has_more"],
    }


_USAGE_PAGE = _list_of({"type": "object"})
_USAGE_QUERY = [
    {"name": "tenant", "in": "query", "required": True, "schema": {"type": "string"}},
    {"name": "since", "in": "query", "schema": {"type": "integer", "minimum": 0}},
    {"name": "after", "in": "query", "schema": {"type": "string"}},
    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 1000}},
]
_PATH_ID = [{"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}]
_CONVERSATION_ID = [{"name": "conversation_id", "in": "path", "required": True, "schema": {"type": "string"}}]
_ITEM_ID = [{"name": "item_id", "in": "path", "required": True, "schema": {"type": "string"}}]
_PAGE = [
    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 100}},
    {"name": "order", "in": "query", "schema": {"enum": ["asc", "desc"]}},
    {"name": "after", "in": "query", "schema": {"type": "string"}},
]
_CONVERSATION = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "object": {"const": "conversation"},
        "created_at": {"type": "integer"},
        "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
    },
    "required": ["id", "object", "created_at", "metadata"],
}
_CONVERSATION_DELETED = {
    "type": "object",
    "properties": {"id": {"type": "string"}, "object": {"const": "conversation.deleted"}, "deleted": {"const": True}},
    "required": ["id", "object", "deleted"],
}
_TOKEN_COUNT = {
    "type": "object",
    "properties": {"object": {"const": "response.input_tokens"}, "input_tokens": {"type": "integer", "minimum": 0}},
    "required": ["object", "input_tokens"],
}


def _body(model: type[BaseModel]) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": _ref(model)}}}


def _conversation_paths() -> dict[str, Any]:
    conversation = _json(_CONVERSATION, "The conversation")
    items = _json(_ref(InputItemList), "Conversation items")
    return {
        "/v1/conversations": {
            "post": {
                "operationId": "createConversation",
                "requestBody": _body(ConversationCreate),
                "responses": {"200": conversation, **_errors()},
            }
        },
        "/v1/conversations/{conversation_id}": {
            "get": {
                "operationId": "getConversation",
                "parameters": _CONVERSATION_ID,
                "responses": {"200": conversation, **_errors()},
            },
            "post": {
                "operationId": "updateConversation",
                "parameters": _CONVERSATION_ID,
                "requestBody": _body(ConversationUpdate),
                "responses": {"200": conversation, **_errors()},
            },
            "delete": {
                "operationId": "deleteConversation",
                "parameters": _CONVERSATION_ID,
                "responses": {"200": _json(_CONVERSATION_DELETED, "Deleted"), **_errors()},
            },
        },
        "/v1/conversations/{conversation_id}/items": {
            "get": {
                "operationId": "listConversationItems",
                "parameters": [*_CONVERSATION_ID, *_PAGE],
                "responses": {"200": items, **_errors()},
            },
            "post": {
                "operationId": "createConversationItems",
                "parameters": _CONVERSATION_ID,
                "requestBody": _body(ItemsCreate),
                "responses": {"200": items, **_errors()},
            },
        },
        "/v1/conversations/{conversation_id}/items/{item_id}": {
            "get": {
                "operationId": "getConversationItem",
                "parameters": [*_CONVERSATION_ID, *_ITEM_ID],
                "responses": {"200": _json({"type": "object"}, "The item"), **_errors()},
            },
            "delete": {
                "operationId": "deleteConversationItem",
                "parameters": [*_CONVERSATION_ID, *_ITEM_ID],
                "responses": {"200": conversation, **_errors()},
            },
        },
    }


@cache
def openapi_document() -> dict[str, Any]:
    models = [
        (ResponsesRequest, "validation"),
        (ResponseObject, "serialization"),
        (InputItemList, "serialization"),
        (DeletedResponse, "serialization"),
        (ChatRequest, "validation"),
        (ConversationCreate, "validation"),
        (ConversationUpdate, "validation"),
        (ItemsCreate, "validation"),
        *batch_models(),
    ]
    _, defs = models_json_schema(models, ref_template=_REF)
    schemas = defs["$defs"]
    schemas["Error"] = _ERROR
    response = _json(_ref(ResponseObject), "The response object")
    stream = {"description": "Server-sent events (`stream: true`)", "content": {"text/event-stream": {}}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "gpt-oss-gateway", "version": "0.1.0"},
        "paths": {
            "/v1/chat/completions": {
                "post": {
                    "operationId": "createChatCompletion",
                    "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(ChatRequest)}}},
                    "responses": {
                        "200": {
                            "description": "A chat.completion object, or chat.completion.chunk events when streaming",
                            "content": {"application/json": {"schema": {"type": "object"}}, **stream["content"]},
                        },
                        **_errors(),
                    },
                }
            },
            "/v1/models": {"get": {"operationId": "listModels", "responses": {"200": _json(_MODEL_LIST, "Models")}}},
            "/v1/models/{model}": {
                "get": {
                    "operationId": "retrieveModel",
                    "parameters": [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}],
                    "responses": {"200": _json(_MODEL, "A model"), **_errors()},
                }
            },
            "/v1/responses": {
                "post": {
                    "operationId": "createResponse",
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": _ref(ResponsesRequest)}},
                    },
                    "responses": {
                        "200": {**response, "content": {**response["content"], **stream["content"]}},
                        **_errors(),
                    },
                }
            },
            "/v1/responses/input_tokens": {
                "post": {
                    "operationId": "countInputTokens",
                    "requestBody": _body(ResponsesRequest),
                    "responses": {"200": _json(_TOKEN_COUNT, "The prompt's length in tokens"), **_errors()},
                }
            },
            "/v1/responses/{response_id}": {
                "get": {
                    "operationId": "getResponse",
                    "parameters": _PATH_ID,
                    "responses": {"200": response, **_errors()},
                },
                "delete": {
                    "operationId": "deleteResponse",
                    "parameters": _PATH_ID,
                    "responses": {"200": _json(_ref(DeletedResponse), "Deleted"), **_errors()},
                },
            },
            "/v1/responses/{response_id}/cancel": {
                "post": {
                    "operationId": "cancelResponse",
                    "parameters": _PATH_ID,
                    "responses": {"200": response, **_errors()},
                }
            },
            "/v1/responses/{response_id}/input_items": {
                "get": {
                    "operationId": "listInputItems",
                    "parameters": [*_PATH_ID, *_PAGE],
                    "responses": {"200": _json(_ref(InputItemList), "Input items"), **_errors()},
                }
            },
            **_conversation_paths(),
            **batch_paths(_json, _ref, _list_of, _errors()),
            "/v1/usage/records": {
                "get": {
                    "operationId": "listUsageRecords",
                    "parameters": _USAGE_QUERY,
                    "responses": {
                        "200": _json(_USAGE_PAGE, "A tenant's usage records, oldest first"),
                        "403": _json({"$ref": _REF.format(model="Error")}, "Not an admin key"),
                        **_errors(),
                    },
                }
            },
        },
        "components": {"schemas": schemas},
    }


async def serve_openapi(request: web.Request) -> web.Response:
    return json_response(openapi_document())
