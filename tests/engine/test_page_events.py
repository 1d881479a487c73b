"""The engine's record of the pages its prefix cache names: snapshots, events in order, and a reader that fell
behind told to take a snapshot again."""

from __future__ import annotations

from backends.engine.page_events import REMOVED, STORED, PageEvents


def test_a_reader_gets_the_events_after_its_snapshot_in_order_or_is_told_it_fell_behind():
    events = PageEvents(capacity=4)
    events.stored(b"a", b"root")
    snapshot = events.snapshot()
    assert (snapshot.seq, snapshot.names) == (1, {b"a": b"root"})
    events.stored(b"b", b"a")
    events.removed(b"a")
    after = events.since(snapshot.seq)
    assert [(e.seq, e.kind, e.name) for e in after] == [(2, STORED, b"b"), (3, REMOVED, b"a")]
    assert events.since(3) == [] and events.snapshot().names == {b"b": b"a"}
    for index in range(4):  # four more: the oldest kept is now event 4
        events.stored(bytes([index]), b"b")
    assert events.since(snapshot.seq) is None  # events 2 and 3 are gone: a new snapshot, not a gap
    assert [e.seq for e in events.since(3)] == [4, 5, 6, 7]
    assert [e.seq for e in events.since(3, limit=2)] == [4, 5]
    assert PageEvents().instance != events.instance  # a restarted engine is another instance
