"""The added-latency baseline for bench/gateway_bench.py: a minimal aiohttp server that waits a fixed time and
answers every POST with the same bytes (the gateway's own answer to the benchmark's request); with
`--stream-body`, a request that asks to stream gets those bytes as an event stream instead. It also stands for
the model server behind LiteLLM.

    python bench/canned_server.py --port 8001 --delay-ms 500 --body answer.json [--stream-body answer.sse]
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from aiohttp import web

STREAMING = (b'"stream":true', b'"stream": true')


def app(body: bytes, delay_s: float, stream_body: bytes | None = None) -> web.Application:
    async def answer(request: web.Request) -> web.Response:
        raw = await request.read()
        await asyncio.sleep(delay_s)
        if stream_body is not None and any(asked in raw for asked in STREAMING):
            return web.Response(body=stream_body, content_type="text/event-stream")
        return web.Response(body=body, content_type="application/json")

    application = web.Application()
    application.router.add_post("/{tail:.*}", answer)
    return application


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay-ms", type=float, required=True)
    parser.add_argument("--body", type=Path, required=True)
    parser.add_argument("--stream-body", type=Path)
    args = parser.parse_args()
    stream_body = args.stream_body.read_bytes() if args.stream_body else None
    served = app(args.body.read_bytes(), args.delay_ms / 1e3, stream_body)
    web.run_app(served, host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()
