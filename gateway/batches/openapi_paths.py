"""The Files and Batch APIs in the OpenAPI document (gateway/openapi.py): their objects as OpenAI defines them."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from .batches_api import CreateBatch

_NULLABLE_INT = {"type": ["integer", "null"]}
_FILE = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "object": {"const": "file"},
        "bytes": {"type": "integer", "minimum": 0},
        "created_at": {"type": "integer"},
        "expires_at": _NULLABLE_INT,
        "filename": {"type": "string"},
        "purpose": {"type": "string"},
        "status": {"enum": ["uploaded", "processed", "error"]},
        "status_details": {"type": ["string", "null"]},
    },
    "required": ["id", "object", "bytes", "created_at", "filename", "purpose"],
}
_FILE_DELETED = {
    "type": "object",
    "properties": {"id": {"type": "string"}, "object": {"const": "file"}, "deleted": {"type": "boolean"}},
    "required": ["id", "object", "deleted"],
}
_STATUSES = ["validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling", "cancelled"]
_BATCH = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "object": {"const": "batch"},
        "endpoint": {"type": "string"},
        "input_file_id": {"type": "string"},
        "completion_window": {"type": "string"},
        "status": {"enum": _STATUSES},
        "output_file_id": {"type": ["string", "null"]},
        "error_file_id": {"type": ["string", "null"]},
        "created_at": {"type": "integer"},
        **{
            f"{stage}_at": _NULLABLE_INT
            for stage in (
                "in_progress",
                "expires",
                "finalizing",
                "completed",
                "failed",
                "expired",
                "cancelling",
                "cancelled",
            )
        },
        "request_counts": {
            "type": "object",
            "properties": {name: {"type": "integer", "minimum": 0} for name in ("total", "completed", "failed")},
            "required": ["total", "completed", "failed"],
        },
        "errors": {"type": ["object", "null"]},
        "usage": {"type": ["object", "null"]},
        "metadata": {"type": ["object", "null"], "additionalProperties": {"type": "string"}},
    },
    "required": ["id", "object", "endpoint", "input_file_id", "completion_window", "status", "created_at"],
}


def batch_models() -> list[tuple[type[BaseModel], str]]:
    """The request models whose JSON schema the document's components carry."""
    return [(CreateBatch, "validation")]


def batch_paths(json: Any, ref: Any, list_of: Any, errors: dict[str, Any]) -> dict[str, Any]:
    """The paths, with the document's helpers: `json(schema, description)`, `ref(model)`, `list_of(item)` (a page)
    and the error answers."""
    file_id = [{"name": "file_id", "in": "path", "required": True, "schema": {"type": "string"}}]
    batch_id = [{"name": "batch_id", "in": "path", "required": True, "schema": {"type": "string"}}]
    page = [
        {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 100}},
        {"name": "after", "in": "query", "schema": {"type": "string"}},
    ]
    upload = {
        "type": "object",
        "properties": {"file": {"type": "string", "format": "binary"}, "purpose": {"const": "batch"}},
        "required": ["file", "purpose"],
    }
    ref_error = errors["404"]["content"]["application/json"]["schema"]
    file = json(_FILE, "The file object")
    batch = json(_BATCH, "The batch object")
    return {
        "/v1/files": {
            "post": {
                "operationId": "createFile",
                "requestBody": {"required": True, "content": {"multipart/form-data": {"schema": upload}}},
                "responses": {"200": file, **errors},
            },
            "get": {
                "operationId": "listFiles",
                "parameters": [*page, {"name": "purpose", "in": "query", "schema": {"type": "string"}}],
                "responses": {"200": json(list_of(_FILE), "The tenant's files"), **errors},
            },
        },
        "/v1/files/{file_id}": {
            "get": {"operationId": "retrieveFile", "parameters": file_id, "responses": {"200": file, **errors}},
            "delete": {
                "operationId": "deleteFile",
                "parameters": file_id,
                "responses": {"200": json(_FILE_DELETED, "Deleted"), **errors},
            },
        },
        "/v1/files/{file_id}/content": {
            "get": {
                "operationId": "downloadFile",
                "parameters": file_id,
                "responses": {
                    "200": {"description": "The file's bytes", "content": {"application/octet-stream": {}}},
                    **errors,
                },
            }
        },
        "/v1/batches": {
            "post": {
                "operationId": "createBatch",
                "requestBody": {"required": True, "content": {"application/json": {"schema": ref(CreateBatch)}}},
                "responses": {"200": batch, **errors},
            },
            "get": {
                "operationId": "listBatches",
                "parameters": page,
                "responses": {"200": json(list_of(_BATCH), "The tenant's batches"), **errors},
            },
        },
        "/v1/batches/{batch_id}": {
            "get": {"operationId": "retrieveBatch", "parameters": batch_id, "responses": {"200": batch, **errors}}
        },
        "/v1/batches/{batch_id}/cancel": {
            "post": {
                "operationId": "cancelBatch",
                "parameters": batch_id,
                "responses": {"200": batch, "409": json(ref_error, "The batch has ended: nothing to cancel"), **errors},
            }
        },
    }
