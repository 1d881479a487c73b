"""Connecting to Redis, and the one policy for its failures: every Redis error is `StoreUnavailable`.

URLs: `redis://` / `rediss://` / `unix://` (standalone), `redis+sentinel://[:pw@]h1:p1,h2:p2/service[/db]`,
`redis+cluster://h:p` or `rediss+cluster://h:p`. Every key of one tenant shares the hash tag
`{t:<hash of tenant>}`, so multi-key operations stay in one Cluster slot.

Whatever Redis answers instead of a result (unreachable, a timeout, out of memory under `noeviction`,
a read-only replica, a wrong password, a service that is not Redis) means the same to every caller:
the store cannot do this now. Callers decide what that means for the request (503, `store: false`,
the limits' `on_store_failure` policy); none of them sees a raw Redis exception, so none answers 500.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import unquote, urlsplit

from redis import exceptions as redis_errors
from redis.asyncio import Redis, RedisCluster, Sentinel
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from .store import StoreUnavailable

_TIMEOUTS = {"socket_connect_timeout": 2.0, "socket_timeout": 2.0}


def _retry_once() -> Retry:
    """A pooled connection that Redis closed (a restart) is replaced and the command sent again, once."""
    return Retry(NoBackoff(), 1, supported_errors=(redis_errors.ConnectionError,))


def tenant_tag(tenant: str) -> str:
    return "{t:" + hashlib.sha256(tenant.encode()).hexdigest()[:16] + "}"


def connect(url: str) -> Any:
    """A redis.asyncio client for the URL (see the module docstring for the schemes)."""
    parts = urlsplit(url)
    try:
        _ = parts.port  # a port that is not a number raises here, not at the first command
    except ValueError as exc:
        raise ValueError(f"the Redis URL is malformed: {exc}") from None
    if parts.scheme in ("redis+cluster", "rediss+cluster"):
        plain = parts.scheme.split("+", 1)[0] + url[len(parts.scheme) :]
        return RedisCluster.from_url(plain, **_TIMEOUTS)
    if parts.scheme == "redis+sentinel":
        try:
            hosts = [
                (h.rsplit(":", 1)[0], int(h.rsplit(":", 1)[1])) for h in parts.netloc.rsplit("@", 1)[-1].split(",")
            ]
        except (IndexError, ValueError):
            raise ValueError("redis+sentinel:// URLs list sentinels as host:port,host:port") from None
        path = [p for p in parts.path.split("/") if p]
        if not path:
            raise ValueError("redis+sentinel:// URLs need the service name as the path")
        password = unquote(parts.password) if parts.password else None
        db = int(path[1]) if len(path) > 1 and path[1].isdigit() else 0
        sentinel = Sentinel(hosts, sentinel_kwargs={**_TIMEOUTS, "password": password}, **_TIMEOUTS)
        return sentinel.master_for(path[0], password=password, db=db, retry=_retry_once())
    if parts.scheme in ("redis", "rediss", "unix"):
        return Redis.from_url(url, retry=_retry_once(), **_TIMEOUTS)
    raise ValueError(
        f"unsupported Redis URL scheme {parts.scheme!r} (redis, rediss, unix, redis+sentinel, redis+cluster)"
    )


def describe_failure(exc: BaseException) -> str:
    """What went wrong, in words an operator can act on (never the payload of a command)."""
    text = str(exc)
    if isinstance(exc, redis_errors.AuthenticationError) or text.startswith(("NOAUTH", "WRONGPASS", "invalid pass")):
        return "authentication failed (check the password in the Redis URL)"
    if isinstance(exc, redis_errors.OutOfMemoryError) or text.startswith("OOM"):
        return "Redis is out of memory (maxmemory reached under noeviction)"
    if isinstance(exc, redis_errors.ReadOnlyError) or text.startswith("READONLY"):
        return "Redis is a read-only replica"
    if isinstance(exc, redis_errors.InvalidResponse):
        return "the server at the Redis URL does not speak the Redis protocol"
    if isinstance(exc, redis_errors.TimeoutError | TimeoutError):
        return "Redis did not answer in time"
    if isinstance(exc, redis_errors.ConnectionError | OSError | redis_errors.ClusterDownError):
        return "Redis is unreachable"
    return f"Redis refused the command ({type(exc).__name__})"


@asynccontextmanager
async def redis_errors_as_unavailable(operation: str) -> AsyncIterator[None]:
    """Every failure of a Redis call in the block becomes StoreUnavailable, with the reason."""
    try:
        yield
    except (redis_errors.RedisError, OSError) as exc:
        reason = describe_failure(exc)
        raise StoreUnavailable(f"{operation}: {reason}", reason=reason) from exc
