"""Structured JSON logs on stdout: metadata only (ids, counts, error types), never prompts, outputs or CoT.

Tracebacks are rendered as plain text without local variables, so no request content can leak through them.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import sys
from datetime import UTC, datetime

import orjson
import structlog


def _stdout_logger(*args: object) -> structlog.PrintLogger:
    """Resolved at each use, so a replaced sys.stdout (tests, daemons) is followed."""
    return structlog.PrintLogger(sys.stdout)


def _json_line(event: dict, **_: object) -> str:
    try:
        return orjson.dumps(event, default=str).decode()
    except TypeError:  # an integer past 64 bits
        return json.dumps(event, default=str, ensure_ascii=False, separators=(",", ":"))


def configure_logging(level: str = "info") -> None:
    logging.basicConfig(format="%(message)s", stream=sys.stdout, level=level.upper())
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(serializer=_json_line),
        ],
        logger_factory=_stdout_logger,
    )


class AccessLog:
    """The access log's lines (one per request: the hot path) in structlog's JSON shape, without its processor
    chain: the fields given are the line (the caller names the request's ids; merging the context variables
    would walk the whole context); written once per event-loop iteration in one write, instead of a write and
    a flush per line."""

    def __init__(self) -> None:
        self._pending: list[str] = []
        atexit.register(self.flush)

    def info(self, event: str, **fields: object) -> None:
        record = {**fields, "event": event}
        record["level"] = "info"
        record["timestamp"] = datetime.now(UTC).isoformat()[:-6] + "Z"
        if not self._pending:
            try:
                asyncio.get_running_loop().call_soon(self.flush)
            except RuntimeError:  # no loop: written at once
                self._pending.append(_json_line(record))
                self.flush()
                return
        self._pending.append(_json_line(record))

    def flush(self) -> None:
        if self._pending:
            lines, self._pending = self._pending, []
            out = sys.stdout
            out.write("\n".join(lines) + "\n")
            out.flush()
