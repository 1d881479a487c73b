"""Where server-side tools may connect: public addresses, and private ones only in networks the operator
allowed. Names are resolved once and the connection goes to a checked address (no rebinding between the
check and the connect); redirects are followed by hand, each hop checked; proxies from the environment are
not used. Page fetches are bounded in time and size."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from pydantic import BaseModel, ConfigDict, Field

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
MAX_REDIRECTS = 5


class OutboundSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # private, loopback and link-local networks tools may still reach (e.g. ["10.1.0.0/16"]); none by default
    allowed_private_networks: list[str] = Field(default_factory=list)
    fetch_timeout_s: float = Field(default=15.0, gt=0, le=120)
    max_page_bytes: int = Field(default=2_000_000, ge=1024)


class OutboundRefused(OSError):
    """The address is not one a tool may reach; the message says which and why (safe to show the model)."""


@dataclass(frozen=True, slots=True)
class OutboundPolicy:
    allowed_private: tuple[Network, ...] = ()

    @classmethod
    def from_settings(cls, settings: OutboundSettings) -> OutboundPolicy:
        return cls(tuple(ipaddress.ip_network(net, strict=False) for net in settings.allowed_private_networks))

    def permits(self, address: str) -> bool:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if ip.is_global and not ip.is_multicast:
            return True
        return any(ip in network for network in self.allowed_private)

    async def addresses(self, host: str, port: int) -> list[tuple[int, str]]:
        """(family, address) pairs of `host` that may be reached; OutboundRefused when there are none."""
        try:
            literal = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            literal = None
        if literal is not None:
            found = [(socket.AF_INET6 if literal.version == 6 else socket.AF_INET, str(literal))]
        else:
            loop = asyncio.get_running_loop()
            try:
                infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except socket.gaierror as exc:
                raise OutboundRefused(f"cannot resolve {host}") from exc
            found = list(dict.fromkeys((info[0], str(info[4][0])) for info in infos))
        allowed = [(family, address) for family, address in found if self.permits(address)]
        if not allowed:
            raise OutboundRefused(f"{host} resolves to an address this gateway may not reach (private or reserved)")
        return allowed


def _is_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


class _GuardedResolver(AbstractResolver):
    """aiohttp's resolver: only checked addresses."""

    def __init__(self, policy: OutboundPolicy) -> None:
        self._policy = policy

    async def resolve(self, host: str, port: int = 0, family: int = socket.AF_INET) -> list[ResolveResult]:
        pairs = await self._policy.addresses(host, port)
        return [
            ResolveResult(hostname=host, host=address, port=port, family=fam, proto=0, flags=socket.AI_NUMERICHOST)
            for fam, address in pairs
        ]

    async def close(self) -> None:
        return None


@dataclass(slots=True)
class Page:
    url: str
    content_type: str
    text: str
    truncated: bool


class PageFetcher:
    """GET a page for the browser tool: http(s) only, checked addresses, bounded time and size."""

    def __init__(self, policy: OutboundPolicy, settings: OutboundSettings) -> None:
        self._policy = policy
        self._settings = settings
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(resolver=_GuardedResolver(self._policy), limit=64)
            timeout = aiohttp.ClientTimeout(total=self._settings.fetch_timeout_s)
            self._session = aiohttp.ClientSession(connector=connector, timeout=timeout, trust_env=False)
        return self._session

    async def fetch(self, url: str) -> Page:
        for _ in range(MAX_REDIRECTS + 1):
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise OutboundRefused(f"only http and https pages can be opened, not {url[:200]}")
            if _is_literal(parts.hostname):  # aiohttp skips its resolver for these: checked here instead
                await self._policy.addresses(parts.hostname, parts.port or 443)
            headers = {"User-Agent": "gpt-oss-gateway browser", "Accept": "text/html, text/plain;q=0.9, */*;q=0.5"}
            async with self._client().get(url, allow_redirects=False, headers=headers) as response:
                if response.status in (301, 302, 303, 307, 308) and "Location" in response.headers:
                    url = urljoin(url, response.headers["Location"])
                    continue
                if response.status >= 400:
                    raise OutboundRefused(f"{url[:200]} answered HTTP {response.status}")
                limit = self._settings.max_page_bytes
                body = bytearray()
                while len(body) <= limit and (chunk := await response.content.read(limit + 1 - len(body))):
                    body += chunk
                charset = response.charset or "utf-8"
                try:
                    text = body[:limit].decode(charset, "replace")
                except LookupError:
                    text = body[:limit].decode("utf-8", "replace")
                return Page(url, response.content_type or "", text, len(body) > limit)
        raise OutboundRefused(f"too many redirects from {url[:200]}")

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
