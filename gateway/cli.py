"""`gpt-oss-gateway` command line."""

from __future__ import annotations

import argparse
import sys

from aiohttp import web

from harmony import VocabularyError

from .app import create_app
from .config import Settings


def _serve(args: argparse.Namespace) -> int:
    given = {"host": args.host, "port": args.port, "vocab_path": args.vocab_path}
    overrides = {key: value for key, value in given.items() if value is not None}
    settings = Settings(**overrides)
    try:
        app = create_app(settings)
    except VocabularyError as exc:
        print(f"gpt-oss-gateway: {exc}", file=sys.stderr)
        return 2
    web.run_app(app, host=settings.host, port=settings.port, print=lambda line: print(line, flush=True))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpt-oss-gateway", description="OpenAI API gateway for gpt-oss models")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the HTTP gateway")
    serve.add_argument("--host", help="bind address (env GATEWAY_HOST, default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (env GATEWAY_PORT, default 8000)")
    serve.add_argument("--vocab-path", help="local o200k_base.tiktoken (env GATEWAY_VOCAB_PATH)")
    serve.set_defaults(run=_serve)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
