"""The added-latency baseline for bench/gateway_bench.py: a minimal aiohttp server that waits a fixed time and
answers every POST with the same bytes (the gateway's own answer to the benchmark's request).

    python bench/canned_server.py --port 8001 --delay-ms 500 --body answer.json
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from aiohttp import web


def app(body: bytes, delay_s: float) -> web.Application:
    async def answer(request: web.Request) -> web.Response:
        await request.read()
        await asyncio.sleep(delay_s)
        return web.Response(body=body, content_type="application/json")

    application = web.Application()
    application.router.add_post("/{tail:.*}", answer)
    return application


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay-ms", type=float, required=True)
    parser.add_argument("--body", type=Path, required=True)
    args = parser.parse_args()
    web.run_app(app(args.body.read_bytes(), args.delay_ms / 1e3), host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()
