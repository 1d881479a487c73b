"""What the Responses request models share with each other and with the Chat and Conversations APIs:
strict models, metadata bounds."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict

from ...limits import (
    MAX_CLIENT_METADATA_CHARS,
    MAX_METADATA_KEY_CHARS,
    MAX_METADATA_KEYS,
    MAX_METADATA_VALUE_CHARS,
)


def _bounded_metadata(metadata: dict[str, str]) -> dict[str, str]:
    if len(metadata) > MAX_METADATA_KEYS:
        raise ValueError(f"at most {MAX_METADATA_KEYS} keys")
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY_CHARS or len(value) > MAX_METADATA_VALUE_CHARS:
            raise ValueError(
                f"keys are at most {MAX_METADATA_KEY_CHARS} characters and values {MAX_METADATA_VALUE_CHARS}"
            )
    return metadata


Metadata = Annotated[dict[str, str], AfterValidator(_bounded_metadata)]  # OpenAI's limits, shared by both APIs


def _bounded_client_metadata(metadata: dict[str, str]) -> dict[str, str]:
    if len(metadata) > MAX_METADATA_KEYS:
        raise ValueError(f"at most {MAX_METADATA_KEYS} keys")
    if sum(len(key) + len(value) for key, value in metadata.items()) > MAX_CLIENT_METADATA_CHARS:
        raise ValueError(f"keys and values come to at most {MAX_CLIENT_METADATA_CHARS} characters in all")
    return metadata


# what a client (Codex: its turn metadata) attaches for itself: stored with the response, never logged
ClientMetadata = Annotated[dict[str, str], AfterValidator(_bounded_client_metadata)]


def type_of(value: Any) -> Any:
    return value.get("type") if isinstance(value, dict) else getattr(value, "type", None)


class Strict(BaseModel):
    """Unknown fields are rejected with a 400 naming them, as OpenAI does."""

    model_config = ConfigDict(extra="forbid", strict=True)
