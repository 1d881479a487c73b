"""`gpt-oss-gateway` command line."""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import json
import sys

from prometheus_client import CollectorRegistry, Counter

from backends.mock import ScriptError
from backends.registry import missing_runtime_message
from harmony import VocabularyError, load_harmony_encoding
from state import StoreUnavailable
from state.keys import FileKeys, KeyAdminError, RedisKeys, new_record

from .app import create_app
from .config import Settings, load_engine_server_settings, load_settings
from .observability.logs import configure_logging
from .observability.metrics import EngineCollector
from .observability.tracing import configure_tracing
from .process import event_loop
from .process.lifecycle import Lifecycle, Listening, bind, serve
from .services import MIN_KEY_SECRET_CHARS, SERVICES, ConfigError
from .usage.export import add_command as add_usage_command

YOUNG_PASS_OBJECTS = 20_000  # the collector's first threshold while serving
_OPTIONS = (
    ("--host", "host", str, "bind address (GATEWAY_HOST, default 127.0.0.1)"),
    ("--port", "port", int, "port (GATEWAY_PORT, default 8000)"),
    ("--vocab-path", "vocab_path", str, "local o200k_base.tiktoken (GATEWAY_VOCAB_PATH)"),
    ("--models", "models", str, "comma-separated model ids to serve (GATEWAY_MODELS)"),
    ("--backend", "backend", str, "onnx (default), vllm, sglang, sglang_generate, llamacpp or mock (GATEWAY_BACKEND)"),
    ("--backend-urls", "backend_urls", str, "comma-separated upstream server URLs (GATEWAY_BACKEND_URLS)"),
    ("--mock-script", "mock_script", str, "mock backend script, JSON (GATEWAY_MOCK_SCRIPT)"),
    ("--redis-url", "redis_url", str, "Redis URL for shared state (GATEWAY_REDIS_URL; default in-memory)"),
)


def _serve(args: argparse.Namespace) -> int:
    overrides = {dest: getattr(args, dest) for _, dest, _, _ in _OPTIONS if getattr(args, dest) is not None}
    configure_logging()
    try:
        settings = load_settings(**overrides)
        event_loop.loop_factory(settings.event_loop)  # a loop asked for and missing fails before anything loads
        sock = bind(settings.host, settings.port)  # before the models load: a busy port fails at once
    except (ValueError, OSError) as exc:
        print(f"gpt-oss-gateway: {exc}", file=sys.stderr)
        return 2
    try:
        app = create_app(settings, warm_checkers=True)
    except (VocabularyError, ConfigError, ScriptError, ValueError) as exc:
        sock.close()
        print(f"gpt-oss-gateway: {exc}", file=sys.stderr)
        return 2
    services = app[SERVICES]
    gc.freeze()  # what start-up built (vocabulary, renderer, models, settings) lives for good: never rescanned
    # a young-generation pass every YOUNG_PASS_OBJECTS new objects, not 700: a request makes thousands, and every
    # pass walks all that is still alive (the requests in flight)
    gc.set_threshold(YOUNG_PASS_OBJECTS, *gc.get_threshold()[1:])
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    listening = Listening(sock, f"http://{host}:{settings.port}", settings.header_timeout_s, settings.idle_timeout_s)

    async def ready() -> bool:
        return all([await backend.ready() for backend in set(services.backends.values())])

    def announce(line: str) -> None:
        print(line, flush=True)

    event_loop.run(serve(app, listening, settings.drain_s, services.lifecycle, announce, ready), settings.event_loop)
    return 0


def _serve_engine(args: argparse.Namespace) -> int:
    """The built-in engine alone, behind the token protocol, for API replicas' `engine` backends."""
    overrides = {dest: getattr(args, dest) for dest in ("host", "port", "options") if getattr(args, dest) is not None}
    configure_logging()
    try:
        settings = load_engine_server_settings(**overrides)
        event_loop.loop_factory(settings.event_loop)
        sock = bind(settings.host, settings.port)
    except (ValueError, OSError) as exc:
        return _refuse(str(exc))
    try:
        from backends.engine.backend import from_options
        from backends.engine.server import EngineServer
    except ModuleNotFoundError as exc:
        sock.close()
        return _refuse(missing_runtime_message("onnx", exc.name or str(exc)))
    try:
        engine = from_options(settings.options, load_harmony_encoding(settings.vocab_path))
    except (VocabularyError, ValueError) as exc:
        sock.close()
        return _refuse(str(exc))
    registry = CollectorRegistry()
    registry.register(EngineCollector({"engine": engine}))
    dropped = Counter("gateway_trace_spans_dropped", "Spans dropped: the export queue was full", registry=registry)
    configure_tracing(dropped.inc)
    lifecycle = Lifecycle()
    api_key = settings.api_key.get_secret_value() if settings.api_key is not None else None
    app = EngineServer(engine, api_key, lifecycle, settings.max_body_bytes).app(registry)

    async def close_engine(_: object) -> None:
        await engine.aclose()

    app.on_cleanup.append(close_engine)
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    listening = Listening(sock, f"http://{host}:{settings.port}", settings.header_timeout_s, settings.idle_timeout_s)
    announce = functools.partial(print, flush=True)
    event_loop.run(
        serve(app, listening, settings.drain_s, lifecycle, announce, engine.ready, handler_cancellation=True),
        settings.event_loop,
    )
    return 0


def _key_store(args: argparse.Namespace, settings: Settings) -> FileKeys | RedisKeys:
    if args.file:
        return FileKeys(args.file)
    if settings.redis_url:
        return RedisKeys.from_url(settings.redis_url)
    raise ConfigError("keys live in Redis (set GATEWAY_REDIS_URL) or in a file (--file PATH)")


async def _keys(args: argparse.Namespace) -> int:
    settings = load_settings()
    store = _key_store(args, settings)
    try:
        if args.action == "create":
            secret = settings.key_secret.get_secret_value() if settings.key_secret is not None else ""
            if len(secret) < MIN_KEY_SECRET_CHARS:  # the same rule `serve` applies: no key it would refuse
                raise ConfigError(
                    f"GATEWAY_KEY_SECRET must be set, {MIN_KEY_SECRET_CHARS}+ characters: keys are stored as HMACs "
                    "made with it"
                )
            key, record = new_record(settings.key_secret.get_secret_value().encode(), args.tenant, args.name)
            await store.add(record)
            print(json.dumps({**record.public(), "key": key}))
        elif args.action == "list":
            for record in await store.records():
                print(json.dumps(record.public()))
        elif not await store.revoke(args.id):
            print(f"gpt-oss-gateway: no key with id {args.id}", file=sys.stderr)
            return 1
    finally:
        await store.aclose()
    return 0


def _run_keys(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_keys(args))
    except (ConfigError, KeyAdminError, StoreUnavailable, ValueError) as exc:
        print(f"gpt-oss-gateway: {exc}", file=sys.stderr)
        return 2


ENGINE_COMMANDS = {
    "make-checkpoint": "write a random-weight gpt-oss checkpoint (its output is noise)",
    "convert": "convert a checkpoint into the engine's cached ONNX graph",
    "build-kernels": "compile the engine's MXFP4 MoE kernels (CUDA too with nvcc)",
}


def _add_engine_commands(commands: argparse._SubParsersAction) -> None:
    """The engine's subcommands, its modules imported only when one runs (a `serve` never loads ONNX Runtime
    unless its backend is the engine); without the engine's runtime, each says in one line what to install."""
    for name, help_text in ENGINE_COMMANDS.items():
        command = commands.add_parser(name, help=help_text, add_help=False, prefix_chars="\x00")
        command.add_argument("rest", nargs="*")  # the engine's own parser reads them, flags included
        command.set_defaults(run=lambda args, name=name: _run_engine_command(name, args.rest))


def _run_engine_command(name: str, rest: list[str]) -> int:
    try:
        from backends.engine.commands import add_commands
    except ModuleNotFoundError as exc:
        return _refuse(missing_runtime_message("onnx", exc.name or str(exc)))
    parser = argparse.ArgumentParser(prog="gpt-oss-gateway")
    add_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args([name, *rest])
    return args.run(args)


def _refuse(message: str) -> int:
    print(f"gpt-oss-gateway: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpt-oss-gateway", description="OpenAI API gateway for gpt-oss models")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the HTTP gateway")
    for flag, dest, kind, text in _OPTIONS:
        serve.add_argument(flag, dest=dest, type=kind, help=text)
    serve.set_defaults(run=_serve)
    keys = commands.add_parser("keys", help="manage API keys (in Redis, or in a keys file with --file)")
    actions = keys.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", help="make a key for a tenant; the key is printed once")
    create.add_argument("--tenant", required=True, help="tenant name ([A-Za-z0-9._-], 1-64 characters)")
    create.add_argument("--name", default="", help="a label to recognise the key by")
    actions.add_parser("list", help="list keys (ids, tenants, labels; never the keys)")
    revoke = actions.add_parser("revoke", help="revoke a key by id")
    revoke.add_argument("id")
    for action in (create, actions.choices["list"], revoke):
        action.add_argument("--file", help="a keys file (GATEWAY_KEYS_FILE) instead of Redis")
    keys.set_defaults(run=_run_keys)
    add_usage_command(commands)
    engine = commands.add_parser("serve-engine", help="run the built-in engine alone (for engine backends)")
    engine.add_argument("--host", help="bind address (GATEWAY_ENGINE_HOST, default 127.0.0.1)")
    engine.add_argument("--port", type=int, help="port (GATEWAY_ENGINE_PORT, default 8100)")
    engine.add_argument("--options", type=json.loads, help="the engine's options, JSON (GATEWAY_ENGINE_OPTIONS)")
    engine.set_defaults(run=_serve_engine)
    _add_engine_commands(commands)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
