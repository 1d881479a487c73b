"""`gpt-oss-gateway usage export --tenant T [--since WHEN] [--format jsonl|csv]`: a tenant's usage records from
the shared ledger in Redis (GATEWAY_REDIS_URL), oldest first, paged through to the end, on standard output."""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import sys
from datetime import datetime
from typing import TextIO

from state import StoreUnavailable
from state.usage_ledger import MAX_PAGE, RedisLedger, UsageRecord

from ..config import load_settings
from ..services import ConfigError, usage_ledger

COLUMNS = list(UsageRecord.__dataclass_fields__)


def since_seconds(value: str) -> float:
    """Unix seconds, or an ISO 8601 date or time (UTC unless it says otherwise)."""
    try:
        return float(value)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{value}' is neither Unix seconds nor an ISO 8601 date") from None
    return (
        moment.timestamp() if moment.tzinfo else moment.replace(tzinfo=datetime.now().astimezone().tzinfo).timestamp()
    )


def add_command(commands: argparse._SubParsersAction) -> None:
    usage = commands.add_parser("usage", help="the usage ledger (GATEWAY_REDIS_URL)")
    actions = usage.add_subparsers(dest="action", required=True)
    export = actions.add_parser("export", help="a tenant's records, oldest first")
    export.add_argument("--tenant", required=True)
    export.add_argument("--since", type=since_seconds, default=0.0, help="Unix seconds or an ISO 8601 date")
    export.add_argument("--format", choices=("jsonl", "csv"), default="jsonl")
    usage.set_defaults(run=_run)


async def export(tenant: str, since: float, form: str, out: TextIO) -> int:
    """Write every record of the tenant kept since `since`; how many."""
    ledger = usage_ledger(load_settings())
    if not isinstance(ledger, RedisLedger):
        raise ConfigError("the usage ledger is shared in Redis: set GATEWAY_REDIS_URL")
    writer = csv.DictWriter(out, COLUMNS) if form == "csv" else None
    if writer is not None:
        writer.writeheader()
    count, after = 0, None
    try:
        while True:
            page = await ledger.page(tenant, since, after, MAX_PAGE)
            for record in page.records:
                row = record.to_json()
                if writer is not None:
                    writer.writerow({**row, "tool_calls": json.dumps(row["tool_calls"])})
                else:
                    out.write(json.dumps(row) + "\n")
            count += len(page.records)
            if not page.has_more:
                return count
            after = page.cursors[-1]
    finally:
        await ledger.aclose()


def _run(args: argparse.Namespace) -> int:
    try:
        asyncio.run(export(args.tenant, args.since, args.format, sys.stdout))
    except (ConfigError, StoreUnavailable, ValueError) as exc:
        print(f"gpt-oss-gateway: {exc}", file=sys.stderr)
        return 2
    return 0
