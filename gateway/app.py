"""aiohttp application factory: health endpoints and the shared Harmony renderer."""

from __future__ import annotations

from aiohttp import web

from harmony import Renderer, load_harmony_encoding

from .config import Settings

RENDERER_KEY = web.AppKey("renderer", Renderer)


async def healthz(request: web.Request) -> web.Response:
    """Liveness: the process serves requests."""
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """Readiness: the vocabulary is loaded (store and backend checks arrive with them)."""
    renderer = request.app[RENDERER_KEY]
    return web.json_response({"status": "ready", "vocab_size": renderer.encoding.vocab_size})


def create_app(settings: Settings) -> web.Application:
    app = web.Application()
    app[RENDERER_KEY] = Renderer(load_harmony_encoding(settings.vocab_path))
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app
