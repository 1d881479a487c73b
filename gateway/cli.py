"""`gpt-oss-gateway` command line."""

from __future__ import annotations

import argparse
import sys

from aiohttp import web

from backends.mock import ScriptError
from harmony import VocabularyError

from .app import create_app
from .config import Settings
from .logs import configure_logging
from .services import ConfigError

_OPTIONS = (
    ("--host", "host", str, "bind address (GATEWAY_HOST, default 127.0.0.1)"),
    ("--port", "port", int, "port (GATEWAY_PORT, default 8000)"),
    ("--vocab-path", "vocab_path", str, "local o200k_base.tiktoken (GATEWAY_VOCAB_PATH)"),
    ("--models", "models", str, "comma-separated model ids to serve (GATEWAY_MODELS)"),
    ("--backend", "backend", str, "backend kind: mock, vllm, sglang, sglang_generate, llamacpp (GATEWAY_BACKEND)"),
    ("--backend-urls", "backend_urls", str, "comma-separated upstream server URLs (GATEWAY_BACKEND_URLS)"),
    ("--mock-script", "mock_script", str, "mock backend script, JSON (GATEWAY_MOCK_SCRIPT)"),
    ("--redis-url", "redis_url", str, "Redis URL for shared state (GATEWAY_REDIS_URL; default in-memory)"),
)


def _serve(args: argparse.Namespace) -> int:
    overrides = {dest: getattr(args, dest) for _, dest, _, _ in _OPTIONS if getattr(args, dest) is not None}
    configure_logging()
    try:
        settings = Settings(**overrides)
        app = create_app(settings)
    except (VocabularyError, ConfigError, ScriptError, ValueError) as exc:
        print(f"gpt-oss-gateway: {exc}", file=sys.stderr)
        return 2
    web.run_app(app, host=settings.host, port=settings.port, print=lambda line: print(line, flush=True))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpt-oss-gateway", description="OpenAI API gateway for gpt-oss models")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the HTTP gateway")
    for flag, dest, kind, text in _OPTIONS:
        serve.add_argument(flag, dest=dest, type=kind, help=text)
    serve.set_defaults(run=_serve)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
