"""Pydantic models of the Conversations API requests."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from ..responses.models.common import Metadata, Strict
from ..responses.models.items import InputItem

MAX_ITEMS_PER_CALL = 20  # as OpenAI: items given at creation or in one items.create


class ConversationCreate(Strict):
    items: Annotated[list[InputItem], Field(max_length=MAX_ITEMS_PER_CALL)] | None = None
    metadata: Metadata | None = None


class ConversationUpdate(Strict):
    metadata: Metadata


class ItemsCreate(Strict):
    items: Annotated[list[InputItem], Field(min_length=1, max_length=MAX_ITEMS_PER_CALL)]
