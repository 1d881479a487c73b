"""Structured JSON logs on stdout: metadata only (ids, counts, error types), never prompts, outputs or CoT.

Tracebacks are rendered as plain text without local variables, so no request content can leak through them.
"""

from __future__ import annotations

import json
import logging
import sys

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
