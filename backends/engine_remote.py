"""The `engine` backend kind: servers of the built-in engine (`gpt-oss-gateway serve-engine`) as upstreams.

Everything the in-process engine is given travels (engine_wire.py): constraints, the tenant and
`prompt_cache_key` (its prefix namespace), logprobs, penalties and seeds, the trace context; balancing,
failover before the first token, timeouts, passive health and abort on disconnect are RemoteBackend's, as for
the other remote kinds. Needs none of the engine's runtime: an API replica on a CPU node runs it.
"""

from __future__ import annotations

from typing import Any

from harmony import HarmonyEncoding

from .engine_wire import EngineDialect
from .remote import RemoteBackend

DIALECT = EngineDialect()


def from_options(options: dict[str, Any], encoding: HarmonyEncoding) -> RemoteBackend:
    return RemoteBackend.from_options(DIALECT, options)
