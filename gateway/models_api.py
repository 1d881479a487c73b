"""`GET /v1/models` and `GET /v1/models/{id}` from the configured models."""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from .errors import not_found
from .json_out import json_response
from .services import SERVICES, Services

STARTED_AT = int(time.time())


def _model(services: Services, model_id: str) -> dict[str, Any]:
    backend = services.backends[model_id]
    return {
        "id": model_id,
        "object": "model",
        "created": STARTED_AT,
        "owned_by": "openai",
        "context_length": backend.capabilities.context_length,
    }


async def list_models(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    return json_response({"object": "list", "data": [_model(services, name) for name in services.backends]})


async def get_model(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    model_id = request.match_info["model_id"]
    if model_id not in services.backends:
        raise not_found("model", f"The model '{model_id}' does not exist.")
    return json_response(_model(services, model_id))


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model_id:.+}", get_model)
