"""The Files API for batches: upload (`purpose: "batch"`, JSONL), list, retrieve, content and delete, per tenant.

An upload streams in and stops at GATEWAY_FILES_MAX_BYTES; a batch input file must be UTF-8 JSONL of at most
GATEWAY_BATCH_MAX_LINES requests (checked in a worker thread: a 200 MB file takes seconds to parse); a tenant's
files together stay within GATEWAY_FILES_TENANT_BYTES and GATEWAY_FILES_TENANT_COUNT. Batch files expire after
30 days unless `expires_after` says otherwise, as OpenAI's do.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from state.files import OverBudget, StoredFile

from ..errors import ApiError, invalid, not_found, store_unavailable_as_503
from ..ids import new_id
from ..json_out import json_response
from ..pagination import page
from ..services import SERVICES, Services
from ..tenants.tenancy import tenant_of

FILES_UNAVAILABLE = "The file store is unavailable; try again."
BATCH_FILE_TTL_S = 30 * 24 * 3600
MIN_EXPIRY_S, MAX_EXPIRY_S = 3600, 30 * 24 * 3600
READ_CHUNK = 1 << 16
MAX_FILENAME_CHARS = 512
MAX_FORM_FIELD_BYTES = 4096


def expiry_seconds(anchor: Any, seconds: Any, param: str) -> int:
    """`expires_after` ({anchor: created_at, seconds}) as seconds after creation: 400s name `param`."""
    if anchor != "created_at":
        raise invalid(f"{param}.anchor", "expires_after.anchor must be 'created_at'.")
    try:
        value = int(seconds)
    except (TypeError, ValueError):
        value = -1
    if not MIN_EXPIRY_S <= value <= MAX_EXPIRY_S:
        raise invalid(f"{param}.seconds", f"expires_after.seconds must be from {MIN_EXPIRY_S} to {MAX_EXPIRY_S}.")
    return value


def check_jsonl(content: bytes, max_lines: int) -> None:
    """A 400 naming the first line that is not a JSON object, or the count when there are too many."""
    count = 0
    for number, raw in enumerate(content.split(b"\n"), 1):
        if not raw.strip():
            continue
        try:
            entry = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            entry = None
        if not isinstance(entry, dict):
            raise invalid("file", f"Line {number} of the file is not a JSON object: a batch file is JSONL.")
        count += 1
        if count > max_lines:
            raise invalid("file", f"A batch input file holds at most {max_lines} requests.")
    if count == 0:
        raise invalid("file", "The file holds no requests.")


async def _read_upload(request: web.Request, services: Services) -> tuple[dict[str, str], str, bytes]:
    """The form's text fields, the file's name and its bytes (within the limit; a stall ends it)."""
    if not request.content_type.startswith("multipart/form-data"):
        raise invalid(None, "Upload files as multipart/form-data with 'file' and 'purpose'.", "invalid_type")
    cap = services.settings.files_max_bytes
    stall_s = services.settings.body_timeout_s
    fields: dict[str, str] = {}
    filename, content = None, bytearray()
    try:
        reader = await request.multipart()
        while True:
            async with asyncio.timeout(stall_s):
                part = await reader.next()
            if part is None:
                break
            if isinstance(part, aiohttp.MultipartReader) or part.name is None:
                raise invalid(None, "The form holds an unexpected part.")
            if part.name == "file":
                filename = part.filename or "upload.jsonl"
                while chunk := await asyncio.wait_for(part.read_chunk(READ_CHUNK), stall_s):
                    content += chunk
                    if len(content) > cap:
                        raise ApiError(413, f"The file is over this gateway's limit of {cap} bytes.", param="file",
                                       code="file_too_large")  # fmt: skip
            else:
                raw = await asyncio.wait_for(part.read(), stall_s)
                if len(raw) > MAX_FORM_FIELD_BYTES:
                    raise invalid(part.name, f"'{part.name}' is too long.")
                fields[part.name] = raw.decode("utf-8", "replace")
    except TimeoutError as exc:
        raise ApiError(408, "The upload stalled.", code="request_timeout") from exc
    except (ValueError, HttpProcessingError) as exc:  # a malformed multipart body (a part's headers too)
        raise invalid(None, "The form could not be read: it is not well-formed multipart/form-data.") from exc
    if filename is None:
        raise invalid("file", "Missing required parameter: 'file'.", "missing_required_parameter")
    return fields, filename[:MAX_FILENAME_CHARS], bytes(content)


async def create_file(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    tenant = tenant_of(request)
    fields, filename, content = await _read_upload(request, services)
    purpose = fields.get("purpose")
    if purpose is None:
        raise invalid("purpose", "Missing required parameter: 'purpose'.", "missing_required_parameter")
    if purpose != "batch":
        raise invalid("purpose", "This gateway keeps files for the Batch API only: purpose must be 'batch'.")
    lifetime = BATCH_FILE_TTL_S
    if "expires_after[anchor]" in fields or "expires_after[seconds]" in fields:
        lifetime = expiry_seconds(fields.get("expires_after[anchor]"), fields.get("expires_after[seconds]"),
                                  "expires_after")  # fmt: skip
    await services.costly.run(tenant, lambda: check_jsonl(content, services.settings.batch_max_lines))
    now = int(time.time())
    file = StoredFile(new_id("file-"), tenant, filename, purpose, len(content), now, now + lifetime)
    try:
        with store_unavailable_as_503(FILES_UNAVAILABLE):
            await services.files.put(file, content)
    except OverBudget as exc:
        settings = services.settings
        raise ApiError(
            400,
            f"This API key's files may hold {settings.files_tenant_bytes} bytes in {settings.files_tenant_count} "
            "files at most; delete some first.",
            param="file",
            code="file_storage_limit_exceeded",
        ) from exc
    return json_response(file.to_api())


async def _file(request: web.Request) -> StoredFile:
    services = request.app[SERVICES]
    file_id = request.match_info["file_id"]
    with store_unavailable_as_503(FILES_UNAVAILABLE):
        file = await services.files.load(tenant_of(request), file_id)
    if file is None:
        raise not_found("file_id", f"No such File object: {file_id}")
    return file


async def retrieve_file(request: web.Request) -> web.Response:
    return json_response((await _file(request)).to_api())


async def file_content(request: web.Request) -> web.StreamResponse:
    file = await _file(request)
    response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
    response.content_length = file.bytes
    await response.prepare(request)
    async for chunk in request.app[SERVICES].files.content(tenant_of(request), file):
        await response.write(chunk)
    await response.write_eof()
    return response


async def list_files(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    with store_unavailable_as_503(FILES_UNAVAILABLE):
        files = await services.files.listing(tenant_of(request))
    purpose = request.query.get("purpose")
    objects = [file.to_api() for file in files if purpose is None or file.purpose == purpose]
    return json_response(page(objects, request.query, "files", max_limit=10_000, default_limit=10_000))


async def delete_file(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    file_id = request.match_info["file_id"]
    with store_unavailable_as_503(FILES_UNAVAILABLE):
        deleted = await services.files.delete(tenant_of(request), file_id)
    if not deleted:
        raise not_found("file_id", f"No such File object: {file_id}")
    return json_response({"id": file_id, "object": "file", "deleted": True})


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/files", create_file)
    app.router.add_get("/v1/files", list_files)
    app.router.add_get("/v1/files/{file_id}", retrieve_file)
    app.router.add_delete("/v1/files/{file_id}", delete_file)
    app.router.add_get("/v1/files/{file_id}/content", file_content)
