"""The Batch API: create, retrieve, list and cancel batches of `/v1/responses` or `/v1/chat/completions` requests.

A batch is created `validating`; a replica's runner (runner.py) checks its lines, runs them at the `flex` tier and
writes its output and error files. The objects are OpenAI's (`request_counts`, the status times, `errors`,
`usage`); a tenant sees only its own batches and can build one only from its own files.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from state.batches import TERMINAL

from ..errors import ApiError, invalid, not_found, store_unavailable_as_503
from ..ids import new_id
from ..intake.json_body import read_model
from ..json_out import json_response
from ..pagination import page
from ..services import SERVICES
from ..tenants.tenancy import key_id_of, tenant_of
from .files_api import FILES_UNAVAILABLE, expiry_seconds

ENDPOINTS = ("/v1/responses", "/v1/chat/completions")
BATCHES_UNAVAILABLE = "The batch store is unavailable; try again."
WINDOW_S = 24 * 3600
KEY_ID = "_key_id"  # the creating API key's id, kept beside the object (never shown)
OUTPUT_EXPIRY = "_output_expires_s"


class ExpiresAfter(BaseModel):
    model_config = ConfigDict(extra="forbid")
    anchor: str
    seconds: int


class CreateBatch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input_file_id: str = Field(max_length=256)
    endpoint: str
    completion_window: Literal["24h"]
    metadata: dict[str, str] | None = None
    output_expires_after: ExpiresAfter | None = None


def public(batch: dict[str, Any]) -> dict[str, Any]:
    """The batch object as clients get it (without what the gateway keeps beside it)."""
    return {key: value for key, value in batch.items() if not key.startswith("_")}


def _check_metadata(metadata: dict[str, str] | None) -> None:
    if metadata is None:
        return
    if len(metadata) > 16:
        raise invalid("metadata", "metadata holds at most 16 pairs.")
    for key, value in metadata.items():
        if len(key) > 64 or len(value) > 512:
            raise invalid("metadata", "metadata keys are at most 64 characters and values 512.")


async def create_batch(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    tenant = tenant_of(request)
    req = await read_model(request, tenant, CreateBatch)
    if req.endpoint not in ENDPOINTS:
        raise invalid("endpoint", f"This gateway runs batches of {' and '.join(ENDPOINTS)} requests.")
    _check_metadata(req.metadata)
    output_expiry = None
    if req.output_expires_after is not None:
        given = req.output_expires_after
        output_expiry = expiry_seconds(given.anchor, given.seconds, "output_expires_after")
    with store_unavailable_as_503(FILES_UNAVAILABLE):
        file = await services.files.load(tenant, req.input_file_id)
    if file is None:
        raise not_found("input_file_id", f"No such File object: {req.input_file_id}")
    if file.purpose != "batch":
        raise invalid("input_file_id", "The input file must have been uploaded with purpose 'batch'.")
    now = int(time.time())
    batch = {
        "id": new_id("batch_"),
        "object": "batch",
        "endpoint": req.endpoint,
        "model": None,
        "errors": None,
        "input_file_id": req.input_file_id,
        "completion_window": req.completion_window,
        "status": "validating",
        "output_file_id": None,
        "error_file_id": None,
        "created_at": now,
        "in_progress_at": None,
        "expires_at": now + WINDOW_S,
        "finalizing_at": None,
        "completed_at": None,
        "failed_at": None,
        "expired_at": None,
        "cancelling_at": None,
        "cancelled_at": None,
        "request_counts": {"total": 0, "completed": 0, "failed": 0},
        "usage": None,
        "metadata": req.metadata,
        KEY_ID: key_id_of(request),
        OUTPUT_EXPIRY: output_expiry,
    }
    with store_unavailable_as_503(BATCHES_UNAVAILABLE):
        await services.batches.save(tenant, batch)
    return json_response(public(batch))


async def _batch(request: web.Request) -> dict[str, Any]:
    services = request.app[SERVICES]
    batch_id = request.match_info["batch_id"]
    with store_unavailable_as_503(BATCHES_UNAVAILABLE):
        batch = await services.batches.load(tenant_of(request), batch_id)
    if batch is None:
        raise not_found("batch_id", f"No such Batch object: {batch_id}")
    return batch


async def retrieve_batch(request: web.Request) -> web.Response:
    return json_response(public(await _batch(request)))


async def cancel_batch(request: web.Request) -> web.Response:
    """Flag the batch; its runner stops starting lines, lets those running end, and writes what finished."""
    services = request.app[SERVICES]
    tenant = tenant_of(request)
    batch = await _batch(request)
    if batch["status"] in TERMINAL:
        raise ApiError(409, f"Cannot cancel a batch with status '{batch['status']}'.", code="batch_not_cancellable")
    with store_unavailable_as_503(BATCHES_UNAVAILABLE):
        batch["cancelling_at"] = await services.batches.request_cancel(tenant, batch["id"], int(time.time()))
        if batch["status"] != "finalizing":
            batch["status"] = "cancelling"
            await services.batches.save(tenant, batch)
    return json_response(public(batch))


async def list_batches(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    with store_unavailable_as_503(BATCHES_UNAVAILABLE):
        batches = await services.batches.listing(tenant_of(request))
    return json_response(page([public(batch) for batch in batches], request.query, "batches"))


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/batches", create_batch)
    app.router.add_get("/v1/batches", list_batches)
    app.router.add_get("/v1/batches/{batch_id}", retrieve_batch)
    app.router.add_post("/v1/batches/{batch_id}/cancel", cancel_batch)
