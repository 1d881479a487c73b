"""The pieces under the remote backends: the SSE reader and the upstream pool."""

from __future__ import annotations

import asyncio

import pytest

from backends.sse_reader import Event, EventTooLarge, sse_events
from backends.upstreams import AFFINITY_SLACK, UpstreamPool


async def _chunks(parts: list[bytes]):
    for part in parts:
        yield part


def _read(parts: list[bytes], limit: int = 1024) -> list[Event]:
    async def collect() -> list[Event]:
        return [event async for event in sse_events(_chunks(parts), limit)]

    return asyncio.run(collect())


def test_events_split_anywhere_across_reads():
    stream = (
        b': ping\n\ndata: {"a": 1}\r\n\r\nid: 7\ndata: first\ndata: second\n\n'
        b'error: {"message": "x"}\n\ndata: [DONE]\n\n'
    )
    expected = [
        Event("data", '{"a": 1}'),
        Event("data", "first\nsecond"),
        Event("error", '{"message": "x"}'),
        Event("data", "[DONE]"),
    ]
    for size in (1, 2, 3, 7, len(stream)):
        assert _read([stream[i : i + size] for i in range(0, len(stream), size)]) == expected


def test_an_event_cut_before_its_blank_line_is_dropped():
    assert _read([b"data: whole\n\ndata: cut\n"]) == [Event("data", "whole")]


@pytest.mark.parametrize("stream", [b"data: " + b"x" * 2000 + b"\n\n", b"data: " + b"x" * 2000])
def test_an_event_over_the_bound_is_refused(stream):
    with pytest.raises(EventTooLarge):
        _read([stream[i : i + 100] for i in range(0, len(stream), 100)])


async def _never(url: str) -> bool:
    return False


def test_pick_prefers_the_least_outstanding_then_the_least_chosen():
    pool = UpstreamPool(["http://a", "http://b", "http://c"], eject_after=2, probe_interval_s=60, probe=_never)
    a, b, c = pool.upstreams
    assert [pool.pick([]).url for _ in range(3)] == ["http://a", "http://b", "http://c"]
    a.outstanding, b.outstanding, c.outstanding = 2, 0, 1
    assert pool.pick([]) is b
    assert pool.pick([b]) is c


def test_ejected_upstreams_are_skipped_until_none_is_left():
    async def scenario() -> None:
        pool = UpstreamPool(["http://a", "http://b"], eject_after=2, probe_interval_s=60, probe=_never)
        a, b = pool.upstreams
        pool.failed(a, "test")
        assert a.healthy  # one failure is not enough
        pool.failed(a, "test")
        assert not a.healthy
        assert all(pool.pick([]) is b for _ in range(3))
        pool.failed(b, "test")
        pool.failed(b, "test")
        assert pool.pick([]) is a  # every upstream is ejected: the one ejected first is tried
        pool.succeeded(a)
        assert a.healthy
        await pool.aclose()

    asyncio.run(scenario())


def test_a_cache_key_keeps_to_its_upstream_unless_it_is_overloaded():
    pool = UpstreamPool([f"http://u{i}" for i in range(4)], eject_after=1, probe_interval_s=60, probe=_never)
    owners = {key: pool.pick([], key) for key in (f"session-{i}" for i in range(40))}
    assert all(pool.pick([], key) is owner for key, owner in owners.items())  # the same upstream each time
    assert len(set(map(id, owners.values()))) == 4  # keys spread over every upstream
    key, owner = next(iter(owners.items()))
    owner.outstanding = AFFINITY_SLACK  # busy, within the slack: still its owner
    assert pool.pick([], key) is owner
    owner.outstanding = AFFINITY_SLACK + 1  # past it: load wins
    assert pool.pick([], key) is not owner
    owner.outstanding = 0
    assert pool.pick([owner], key) is not owner  # a retry avoids the upstream that failed it
