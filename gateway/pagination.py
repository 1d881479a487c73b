"""OpenAI's list pages over items in order: `order` (asc/desc), `limit` (1-100), `after` (an item id)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import invalid, not_found


def page(
    items: list[dict[str, Any]], query: Mapping[str, str], owner: str, max_limit: int = 100, default_limit: int = 20
) -> dict[str, Any]:
    """The list object for the query; `owner` names what holds the items, for the 404 of an unknown `after`."""
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise invalid("order", "order must be 'asc' or 'desc'.")
    try:
        limit = int(query.get("limit", str(default_limit)))
    except ValueError as exc:
        raise invalid("limit", f"limit must be an integer from 1 to {max_limit}.") from exc
    if not 1 <= limit <= max_limit:
        raise invalid("limit", f"limit must be an integer from 1 to {max_limit}.")
    ordered = list(items if order == "asc" else reversed(items))
    after = query.get("after")
    if after is not None:
        ids = [item.get("id") for item in ordered]
        if after not in ids:
            raise not_found("after", f"Item '{after}' not found in {owner}.")
        ordered = ordered[ids.index(after) + 1 :]
    data = ordered[:limit]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": len(ordered) > limit,
    }
