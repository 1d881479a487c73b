"""The prefix router's choice on its own: an opening every conversation shares (Harmony's system message) does not
pile new conversations onto one server, a conversation still goes back to the server that holds it, and with a
`prompt_cache_key` and nothing held anywhere the key's own server among the least loaded is chosen, by every replica
alike; a full server is passed over while another has room, a prefix many sessions share stays where it is held
and spreads one server at a time, a miss goes where the fewest prompt tokens are queued, and a server's pushed load
is read as untrusted input."""

from __future__ import annotations

import collections
import time

import pytest

from backends.base import GenerateRequest, ServerLoad
from backends.routing.held_pages import PublishedPages, RoutedPages
from backends.routing.kv_events import OutOfOrder, _apply
from backends.routing.router import Decision, PrefixRouter, RoutingSettings, ServerView, _rendezvous

URLS = ["http://a", "http://b", "http://c"]
OPENING = list(range(1000, 1160))  # 160 tokens every conversation starts with


def _router(min_match: float = 0.3) -> PrefixRouter:
    settings = RoutingSettings(32, 2, 600.0, 65_536, min_match)
    return PrefixRouter(URLS, settings, published=False)


def _answered(router: PrefixRouter, request: GenerateRequest, in_flight: dict[str, int]) -> Decision:
    """Route `request` and let it begin to answer there (its server then holds its prompt)."""
    names = router.pages(request)
    decision = router.choose(request, in_flight, names=names)
    router.sending(decision.url, decision.prompt_tokens, names).answering()
    return decision


def _conversation(index: int, turns: int = 1) -> GenerateRequest:
    own = [20_000 + index * 1000 + i for i in range(500 * turns)]
    return GenerateRequest(OPENING + own, 16, (), f"r{index}", tenant="acme")


def _busiest(router: PrefixRouter, conversations: int, window: int = 3) -> int:
    """New conversations, `window` in flight at once (each ends as the window's next one arrives): the most any
    one server ran at once."""
    in_flight = dict.fromkeys(URLS, 0)
    running: collections.deque[str] = collections.deque()
    busiest = 0
    for index in range(conversations):
        if len(running) == window:
            in_flight[running.popleft()] -= 1
        url = _answered(router, _conversation(index), dict(in_flight)).url
        in_flight[url] += 1
        running.append(url)
        busiest = max(busiest, in_flight[url])
    return busiest


def test_new_conversations_sharing_only_an_opening_spread_over_the_servers():
    assert _busiest(_router(), 30) == 1  # three at once over three servers: one each
    # counting the opening (160 of their 660 tokens), they pile onto its server as far as `load_slack` goes
    assert _busiest(_router(min_match=0.0), 30) == 3


def test_a_conversation_goes_back_to_the_server_that_holds_it():
    router = _router()
    in_flight = dict.fromkeys(URLS, 0)
    first = _answered(router, _conversation(7), in_flight)
    in_flight[first.url] = 2  # busier than the others, within the slack
    again = router.choose(_conversation(7, turns=2), in_flight)  # the same conversation, a turn longer
    assert again.url == first.url and again.how == "prefix" and again.matched_tokens >= 640


def _keyed(index: int, key: str) -> GenerateRequest:
    return GenerateRequest(_conversation(index).prompt, 16, (), f"k{index}", cache_key=key, tenant="acme")


def test_with_a_key_and_nothing_held_the_key_s_server_among_the_least_loaded_is_chosen_by_every_replica():
    keyed = [_keyed(i, f"session-{i % 4}") for i in range(12)]
    even = dict.fromkeys(URLS, 1)
    for request in keyed:
        one, other = _router().choose(request, even), _router().choose(request, even)  # two replicas
        assert one.url == other.url and one.how == "key"
    chosen = {request.cache_key: _router().choose(request, even).url for request in keyed}
    assert len(set(chosen.values())) > 1  # keys spread, not all to one server
    uneven = {"http://a": 1, "http://b": 0, "http://c": 1}
    assert {_router().choose(request, uneven).url for request in keyed} == {"http://b"}  # the least loaded
    overloaded = dict.fromkeys(URLS, 0) | {chosen["session-0"]: 5}
    assert _router().choose(keyed[0], overloaded).url != chosen["session-0"]  # never to an overloaded server


def test_keys_that_hash_to_one_server_start_evenly():
    """Six sessions whose keys all hash to one server, started one after another: two a server (by the key's
    server alone, all six went to one)."""
    router = _router()
    keys = [key for key in (f"k{i}" for i in range(400)) if _rendezvous_first(key) == "http://a"][:6]
    in_flight = dict.fromkeys(URLS, 0)
    for index, key in enumerate(keys):
        decision = router.choose(_keyed(index, key), dict(in_flight))
        assert decision.how == "key"
        in_flight[decision.url] += 1
    assert sorted(in_flight.values()) == [2, 2, 2]


def _rendezvous_first(key: str) -> str:
    return max(URLS, key=lambda url: int.from_bytes(_rendezvous(key, url)))


def _slotted(slots: int) -> PrefixRouter:
    settings = RoutingSettings(32, 2, 600.0, 65_536, 0.3, server_slots=slots)
    return PrefixRouter(URLS, settings, published=False)


def _session(index: int, tenant: str = "acme") -> GenerateRequest:
    """A session of a tenant whose users share one long system prompt: most of its prompt is the shared part, then
    the user's own question."""
    question = [30_000 + index * 100 + i for i in range(64)]
    return GenerateRequest(OPENING * 5 + question, 16, (), f"s{index}", tenant=tenant)


def _sessions_at_once(router: PrefixRouter, sessions: int = 6, late: bool = False) -> tuple[list[int], int]:
    """The first session alone (its server then holds the shared prompt), then `sessions` more at once, none of
    which has begun to answer (their prompt tokens still queued where they went): how many each server runs,
    busiest first, and how many ran the shared prompt whole. `late`: each choice sees the loads one choice late (a
    second replica's request not yet in the server's counts)."""
    seen = dict.fromkeys(URLS, 0)
    _answered(router, _session(0), dict(seen))
    in_flight, whole, previous = dict(seen), 0, None
    for index in range(1, sessions + 1):
        names = router.pages(_session(index))
        decision = router.choose(_session(index), dict(seen if late else in_flight), names=names)
        router.sending(decision.url, decision.prompt_tokens, names)
        whole += decision.prompt_tokens > 64
        in_flight[decision.url] += 1
        if late and previous is not None:
            seen[previous] += 1
        previous = decision.url
    return sorted(in_flight.values(), reverse=True), whole


def test_a_shared_prompt_stays_where_it_is_held_and_spreads_one_server_at_a_time():
    """Six new sessions at once on one shared prompt (864 tokens, then each user's 64): the server holding it takes
    them while within `load_slack` (three), then each other server runs the prompt once, and the rest go back to
    where it is held and answered soonest: four, one and one, two servers running it whole. Before, a rule for new
    sessions on a shared prefix sent them only to the least loaded: two a server, four running it whole, and in
    bench/fleet_routing_bench.py those four (two to a server, arriving at once) took 60-69 s to their first tokens
    where the holder's took 4-6 s."""
    assert _sessions_at_once(_router()) == ([4, 1, 1], 2)
    # the holder full at three: the other two run it, and the last session beside one of them (neither answered yet)
    assert _sessions_at_once(_slotted(3)) == ([3, 2, 1], 3)
    assert _sessions_at_once(_router(), late=True)[1] == 2  # loads seen late: still once a server


def test_sessions_on_one_shared_prompt_break_ties_apart_by_their_own_last_tokens():
    """New sessions on one shared prompt differing only within its last page (a user's few words), routed at once
    by replicas that see none of each other's requests: each replica's tie-breaker is the whole prompt, so they do
    not all go to one server."""
    shared = OPENING + list(range(5000, 5100))  # 260 tokens: 8 whole pages of 32, then 4 tokens
    chosen = {
        _router()
        .choose(GenerateRequest([*shared, 7000 + index], 16, (), f"s{index}", tenant="acme"), dict.fromkeys(URLS, 0))
        .url
        for index in range(12)
    }
    assert len(chosen) >= 2


def test_a_miss_goes_where_the_fewest_prompt_tokens_are_queued():
    """Nothing of a prompt held anywhere, the servers' loads alike: not to a server still running prompts (its count
    pushed on its event stream, or this replica's own requests not yet answering, whichever is larger); each queued
    prompt counts up to the new prompt's own length (they fill side by side: four of 100 tokens count 200 before a
    prompt of 50); once those answer, the tie is the prompt's own server again."""
    request, even = _conversation(11), dict.fromkeys(URLS, 1)  # 660 tokens
    usual = _router().choose(request, even).url
    pushed = _router()
    pushed.servers[usual].pushed = ServerLoad(1, 0, 3000, 1)
    assert pushed.choose(request, even).url != usual
    pushed.servers[usual].pushed = ServerLoad(1, 0, 400, 4)  # four prompts of about 100 tokens: 400 before it
    assert pushed.servers[usual].queued_before(660) == 400 and pushed.servers[usual].queued_before(50) == 200
    assert pushed.choose(request, even).url != usual
    sent = _router()
    view = sent.servers[usual]
    sending = sent.sending(usual, 3000, sent.pages(_conversation(99)))
    small = sent.sending(usual, 20, sent.pages(_conversation(98)))
    assert view.queued() == 3020 and view.queued_before(660) == 680 and sent.choose(request, even).url != usual
    view.pushed = ServerLoad(1, 0, 1000, 1)  # the server's count is smaller: this replica's is used
    assert view.queued_before(660) == 680
    sending.done()
    sending.answering()  # ended: no more to count off, nothing noted as held
    assert view.queued() == 1000 and view.queued_before(660) == 660 and len(view.routed) == 0
    small.answering()
    assert view.sent == {} and len(view.routed) > 0
    view.pushed = ServerLoad(1, 0, 0, 0)
    assert sent.choose(request, even).url == usual


def test_a_conversation_keeps_its_server_within_the_load_slack_among_many_sessions():
    """Conversations sharing an opening part ways there: a conversation's later turn, held far past that, is no
    new session on a shared prefix, so it keeps its server at the whole `load_slack` (2) above the least loaded."""
    router = _router()
    for index in range(6):
        _answered(router, _conversation(index), dict.fromkeys(URLS, 0))
    first = _answered(router, _conversation(7), dict.fromkeys(URLS, 0))
    busy = dict.fromkeys(URLS, 0) | {first.url: 2}
    assert router.choose(_conversation(7, turns=2), busy).url == first.url


def test_a_tenant_s_prompt_is_held_only_in_its_own_namespace():
    """Tenant A's sessions share a prompt; tenant B's session with the same tokens holds nothing of A's anywhere: its
    pages are named in its own namespace."""
    router = _router()
    for index in range(3):
        _answered(router, _session(index), dict.fromkeys(URLS, 0))
    assert router.choose(_session(9), dict.fromkeys(URLS, 0)).matched_tokens >= 800
    other = router.choose(_session(9, tenant="globex"), dict.fromkeys(URLS, 0))
    assert other.matched_tokens == 0 and other.how == "load"


def test_a_conversation_stays_while_its_server_has_room_and_moves_when_it_is_full():
    router = _slotted(2)
    first = _answered(router, _conversation(3), dict.fromkeys(URLS, 0))
    longer = _conversation(3, turns=2)
    busy = dict.fromkeys(URLS, 0) | {first.url: 1}
    assert router.choose(longer, busy).url == first.url  # one slot left: it stays
    full = dict.fromkeys(URLS, 0) | {first.url: 2}
    moved = router.choose(longer, full)
    assert moved.url != first.url and moved.how == "load"
    everywhere = dict.fromkeys(URLS, 2)
    assert router.choose(longer, everywhere).url == first.url  # no room anywhere: the prefix decides again


def test_a_server_that_says_requests_wait_counts_as_full():
    """No slots known: the server's own count of waiting requests (its /metrics or its event stream) marks it
    full, though this replica has nothing in flight there."""
    router = _router()
    first = _answered(router, _conversation(4), dict.fromkeys(URLS, 0))
    longer = _conversation(4, turns=2)
    router.servers[first.url].pushed = ServerLoad(1, 0)
    assert router.choose(longer, dict.fromkeys(URLS, 0)).url == first.url
    router.servers[first.url].pushed = ServerLoad(1, 1)
    assert router.choose(longer, dict.fromkeys(URLS, 0)).url != first.url
    router.servers[first.url].pushed = None
    router.servers[first.url].reported, router.servers[first.url].reported_at = (0.0, 1.0), time.monotonic()
    assert router.choose(longer, dict.fromkeys(URLS, 0)).url != first.url
    router.servers[first.url].reported_at -= 60  # a stale figure counts for nothing
    assert router.choose(longer, dict.fromkeys(URLS, 0)).url == first.url
    slotted = _slotted(4)
    first = _answered(slotted, _conversation(4), dict.fromkeys(URLS, 0))
    slotted.servers[first.url].pushed = ServerLoad(1, 1)  # slots known: one just arrived is no sign of a full server
    assert slotted.choose(longer, dict.fromkeys(URLS, 0)).url == first.url


def test_a_server_s_pushed_load_is_taken_only_from_its_own_well_formed_events():
    """What an engine server's event stream says of its load, read as untrusted input: a `load` event of the
    snapshot's instance sets it; another instance's, or a count that is not one, breaks the stream (the follower
    starts again from a snapshot) and leaves the load as it was."""
    view = ServerView(RoutedPages(16, 60.0), PublishedPages())
    snapshot = {"instance": "i1", "page_size": 16, "prefix_cache_scope": "tenant", "seq": 3, "pages": []}
    _apply(view, {**snapshot, "slots": 4, "running": 1, "waiting": 0})  # a server that counts no prompt tokens
    assert (view.slots, view.pushed) == (4, (1, 0, 0, 0))
    _apply(view, {"instance": "i1", "seq": 3, "running": 4, "waiting": 2, "filling": 900, "filling_prompts": 3})
    assert view.pushed == (4, 2, 900, 3) and view.full(view.load(0)) and view.queued() == 900
    for bad in ({"instance": "i2", "seq": 3, "running": 0, "waiting": 0}, {"instance": "i1", "running": -1,
                "waiting": 0}, {"instance": "i1", "running": "2", "waiting": 0}, {"instance": "i1", "running": True,
                "waiting": 0}, {"instance": "i1", "running": 1, "waiting": 0, "filling": -5}, {"instance": "i1",
                "running": 1, "waiting": 0, "filling": 5, "filling_prompts": 1.5}):  # fmt: skip
        with pytest.raises(OutOfOrder):
            _apply(view, bad)
        assert view.pushed == (4, 2, 900, 3), bad


def _warming(min_tokens: int = 256) -> PrefixRouter:
    settings = RoutingSettings(32, 2, 600.0, 65_536, 0.3, warm_min_tokens=min_tokens, warm_window_s=60.0)
    return PrefixRouter(URLS, settings, published=False)


def test_a_hot_shared_prefix_is_sent_ahead_to_each_lighter_server_that_does_not_hold_it_once():
    """A tenant's sessions on one long system prompt (800 tokens): the first holds it on one server; from the second
    session matching it there (two sessions: hot) while that server is busier than another, the prompt's held
    pages are named for the least loaded server without them, then for the next, each server once a window."""
    router = _warming()
    holder = _answered(router, _session(0), dict.fromkeys(URLS, 0)).url
    in_flight = dict.fromkeys(URLS, 0) | {holder: 1}
    first = router.choose(_session(1), dict(in_flight))
    assert first.url == holder and first.how == "prefix" and first.warm is None  # one session: not hot yet
    in_flight[holder] = 2
    warmed = []
    for index in range(2, 6):
        decision = router.choose(_session(index), dict(in_flight))
        assert decision.url == holder
        if decision.warm is not None:
            warmed.append(decision.warm)
            assert decision.warm.tokens == 800  # the pages it shares, whole
            in_flight[decision.warm.url] += 1  # the warm-up runs there
    assert sorted(w.url for w in warmed) == sorted(u for u in URLS if u != holder)  # each other server, once
    assert router.report(in_flight).warmups == 2


def test_nothing_is_sent_ahead_for_a_conversation_s_turns_an_idle_holder_or_with_warming_off():
    """A conversation's turns match pages only it wrote (never hot); a hot prefix on a server no busier than the
    others stays there; `warm_min_tokens` 0 sends nothing ahead."""
    router = _warming()
    first = _answered(router, _conversation(5), dict.fromkeys(URLS, 0))
    busy = dict.fromkeys(URLS, 0) | {first.url: 2}
    for turns in range(2, 6):
        decision = _answered(router, _conversation(5, turns=turns), busy)
        assert decision.url == first.url and decision.warm is None
    idle = _warming()
    _answered(idle, _session(0), dict.fromkeys(URLS, 0))
    assert all(idle.choose(_session(i), dict.fromkeys(URLS, 1)).warm is None for i in range(1, 5))
    off = _warming(min_tokens=0)
    holder = _answered(off, _session(0), dict.fromkeys(URLS, 0)).url
    loaded = dict.fromkeys(URLS, 0) | {holder: 2}
    assert all(off.choose(_session(i), loaded).warm is None for i in range(1, 5))


def test_a_server_being_sent_a_prefix_gets_requests_on_it_only_once_no_holder_has_room():
    """Both other servers being sent the shared prompt ahead (two slots each): while the holder has a free slot, a
    session on the prompt goes there, where it waits for no prefill. With the holder full, sessions wait behind the
    warm-ups instead, one on each server being warmed (counted as holding the prompt, behind what is queued there),
    not on the holder for a slot; once a warm-up has answered, that server holds the prompt."""
    settings = RoutingSettings(32, 2, 600.0, 65_536, 0.3, server_slots=2, warm_min_tokens=256)
    router = PrefixRouter(URLS, settings, published=False)
    holder = _answered(router, _session(0), dict.fromkeys(URLS, 0)).url
    in_flight = dict.fromkeys(URLS, 0) | {holder: 1}
    router.choose(_session(1), dict(in_flight))
    warms = [router.choose(_session(i), dict(in_flight)).warm for i in (2, 3)]
    assert all(warms) and {w.url for w in warms} == set(URLS) - {holder}
    warm_ups = []
    for index, warm in enumerate(warms):  # sent as the backend sends them: their prompt queued there
        ahead = GenerateRequest(_session(2).prompt[: warm.tokens], 1, (), f"ahead{index}", tenant="acme")
        warm_ups.append(router.sending(warm.url, warm.tokens, router.pages(ahead)))
        in_flight[warm.url] += 1
    held = router.choose(_session(4), dict(in_flight))
    assert (held.url, held.matched_tokens) == (holder, 800)
    in_flight[holder] = 2  # full
    behind = []
    for index in (5, 6):
        names = router.pages(_session(index))
        decision = router.choose(_session(index), dict(in_flight), names=names)
        assert decision.how == "prefix" and decision.matched_tokens == 800 and decision.prompt_tokens == 64
        router.sending(decision.url, decision.prompt_tokens, names)
        in_flight[decision.url] += 1
        behind.append(decision.url)
    assert sorted(behind) == sorted(w.url for w in warms)  # one behind each warm-up
    first = warms[0]
    warm_ups[0].answering()
    router.warming.done(first.prefix, first.url)
    in_flight[first.url] -= 1
    assert router.warming.at(first.prefix) == {warms[1].url}
    # it holds the warm-up's whole pages (its last token is always run: 24 pages of 32)
    assert router._held(router.servers[first.url], _session(7), router.pages(_session(7))) == 768
