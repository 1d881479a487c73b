"""The Responses WebSocket mode through the real SDK's `responses.connect()`: the same events as the SSE
stream, continuation by `previous_response_id` held for the socket even with `store: false`, lanes
(`stream_id`) multiplexed, errors as `error` events with the socket still usable, and the socket's bounds:
keys, a per-tenant cap, message size, idle time, and a drain that finishes what runs and closes with 1001."""

from __future__ import annotations

import json
import threading
import time

import openai
import pytest
from gateway_fixtures import gateway_settings
from live_gateway import LiveGateway
from pydantic import TypeAdapter
from responses_socket import SERVER_EVENT, TERMINAL, api_client, next_event, raw_socket, until_done
from websockets.exceptions import ConnectionClosed, InvalidStatus

MODEL = "gpt-oss-120b"
STREAM_EVENT = TypeAdapter(openai.types.responses.ResponseStreamEvent)


def _types(events) -> list[str]:
    return [event.type for event in events]


def test_a_socket_streams_the_same_events_as_sse_and_continues_without_storing(gateway):
    api = api_client(gateway)
    sse = [event.type for event in api.responses.create(model=MODEL, input="thanks", stream=True)]
    with api.responses.connect() as connection:
        connection.response.create(model=MODEL, input="thanks", store=False)
        first = until_done(connection)
        assert _types(first) == sse
        done = first[-1].response
        assert done.output_text == "You are welcome." and done.store is False
        connection.response.create(model=MODEL, input="What did I say?", previous_response_id=done.id, store=False)
        second = until_done(connection)
    assert second[-1].type == "response.completed"
    assert "thanks" in gateway.backend.prompt_text() and "You are welcome." in gateway.backend.prompt_text()
    with pytest.raises(openai.BadRequestError) as missing:  # held by that socket alone: never stored
        api.responses.create(model=MODEL, input="again", previous_response_id=done.id)
    assert missing.value.code == "previous_response_not_found"


def test_lanes_run_side_by_side_and_say_which_they_are(gateway):
    api = api_client(gateway)
    with api.responses.connect() as connection:
        connection.response.create(model=MODEL, input="say it slowly", stream_id="slow")
        connection.response.create(model=MODEL, input="thanks", stream_id="quick")
        events = until_done(connection, count=2)
    by_lane = {lane: [e for e in events if getattr(e, "stream_id", None) == lane] for lane in ("slow", "quick")}
    assert all(getattr(event, "stream_id", None) in ("slow", "quick") for event in events)
    assert by_lane["quick"][-1].type == by_lane["slow"][-1].type == "response.completed"
    quick_done = events.index(by_lane["quick"][-1])
    assert quick_done < events.index(by_lane["slow"][-1])  # the quick lane did not wait for the slow one
    assert any(events.index(e) > quick_done for e in by_lane["slow"])


def test_a_bad_event_gets_an_error_event_and_the_socket_stays_usable(gateway):
    with raw_socket(gateway) as socket:
        for message, param in (
            ("not json", None),
            (json.dumps(["a list"]), None),
            (json.dumps({"type": "response.dance"}), "type"),
            (json.dumps({"type": "response.create", "model": MODEL, "input": "hi", "background": True}), "background"),
            (json.dumps({"type": "response.create", "model": MODEL, "input": "hi", "bogus": 1}), "bogus"),
            (json.dumps({"type": "response.create", "model": MODEL, "input": "hi", "stream_id": 7}), "stream_id"),
            (
                json.dumps({"type": "response.create", "model": MODEL, "input": "hi", "stream_id": "a lane"}),
                "stream_id",
            ),
            (json.dumps({"type": "response.steer", "input": "x", "previous_response_id": "resp_1"}), "type"),
            (json.dumps({"type": "response.create", "model": MODEL, "input": "hi", "generate": "no"}), "generate"),
        ):
            socket.send(message)
            error = SERVER_EVENT.validate_python(next_event(socket))
            assert error.type == "error" and error.status == 400 and error.error.param == param, error
            assert param != "stream_id" or error.error.code == "invalid_stream_id"
        socket.send(json.dumps({"type": "response.create", "model": MODEL, "input": "thanks"}))
        kinds = []
        while not kinds or kinds[-1] not in TERMINAL:
            kinds.append(next_event(socket)["type"])
        assert kinds[-1] == "response.completed"


def test_the_socket_needs_a_key_and_a_tenant_has_a_cap(tmp_path):
    live = LiveGateway(gateway_settings(tmp_path, ws_max_sockets=2)).start()
    try:
        with pytest.raises(InvalidStatus) as refused:
            raw_socket(live, key="sk-wrong")
        assert refused.value.response.status_code == 401
        with raw_socket(live), raw_socket(live):
            with pytest.raises(InvalidStatus) as capped:
                raw_socket(live)
            assert capped.value.response.status_code == 429
            raw_socket(live, key="sk-tenant-b").close()  # another tenant is not held to this one's cap
        with raw_socket(live):  # the two closed: room again
            pass
    finally:
        live.stop()


def test_a_message_over_the_size_limit_and_an_idle_socket_are_closed(tmp_path):
    live = LiveGateway(gateway_settings(tmp_path, max_body_bytes=4096, ws_idle_s=0.5)).start()
    try:
        with raw_socket(live) as socket:
            socket.send(json.dumps({"type": "response.create", "model": MODEL, "input": "x" * 10_000}))
            with pytest.raises(ConnectionClosed) as closed:
                socket.recv(timeout=10)
            assert closed.value.rcvd.code == 1009
        with raw_socket(live) as socket:
            started = time.monotonic()
            with pytest.raises(ConnectionClosed) as idle:
                socket.recv(timeout=10)
            assert idle.value.rcvd.code == 1000 and time.monotonic() - started < 5
    finally:
        live.stop()


def test_a_draining_replica_finishes_what_runs_then_closes_with_going_away(tmp_path):
    live = LiveGateway(gateway_settings(tmp_path)).start()
    try:
        with raw_socket(live) as socket:
            socket.send(json.dumps({"type": "response.create", "model": MODEL, "input": "say it slowly"}))
            assert next_event(socket)["type"] == "response.created"
            drain = threading.Thread(target=live.call, args=(live.services.lifecycle.drain(30), 40))
            drain.start()
            kinds = []
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    kinds.append(next_event(socket)["type"])
            assert kinds[-1] == "response.completed"  # finished, not cut
            assert closed.value.rcvd.code == 1001
            drain.join(30)
    finally:
        live.stop()


def test_sockets_and_their_responses_are_metered(gateway):
    registry = gateway.services.metrics.registry

    def value(name: str, **labels: str) -> float:
        return registry.get_sample_value(name, labels) or 0.0

    before = value("gateway_websocket_responses_total", status="completed", tenant="tenant-a")
    with raw_socket(gateway) as socket:
        deadline = time.monotonic() + 5
        while value("gateway_websockets_open") < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert value("gateway_websockets_open") == 1
        socket.send(json.dumps({"type": "response.create", "model": MODEL, "input": "thanks"}))
        while next_event(socket)["type"] not in TERMINAL:
            pass
        socket.send(json.dumps({"type": "response.create", "model": "no-such-model", "input": "thanks"}))
        assert next_event(socket)["type"] == "error"
    deadline = time.monotonic() + 5
    while value("gateway_websockets_open") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert value("gateway_websockets_open") == 0
    assert value("gateway_websocket_responses_total", status="completed", tenant="tenant-a") == before + 1
    assert value("gateway_websocket_responses_total", status="refused", tenant="tenant-a") >= 1


def test_generate_false_prepares_a_response_to_continue_from(gateway):
    """A create with generate: false samples nothing: the response completes with no output, and a later
    create on the socket continues from it with only the new input."""
    with raw_socket(gateway) as socket:
        socket.send(
            json.dumps(
                {
                    "type": "response.create",
                    "model": MODEL,
                    "input": "My name is Ada.",
                    "generate": False,
                    "store": False,
                }
            )
        )
        created, completed = next_event(socket), next_event(socket)
        assert (created["type"], completed["type"]) == ("response.created", "response.completed")
        prepared = completed["response"]
        assert prepared["output"] == [] and prepared["usage"]["output_tokens"] == 0
        assert prepared["usage"]["input_tokens"] > 0
        prompts = len(gateway.backend.prompts)
        socket.send(
            json.dumps(
                {"type": "response.create", "model": MODEL, "input": "thanks", "previous_response_id": prepared["id"]}
            )
        )
        kinds = []
        while not kinds or kinds[-1] not in TERMINAL:
            kinds.append(next_event(socket)["type"])
    assert kinds[-1] == "response.completed"
    assert len(gateway.backend.prompts) == prompts + 1  # one sampling in all: the second create's
    assert "My name is Ada." in gateway.backend.prompt_text()


def test_a_socket_has_a_bounded_number_of_lanes(gateway):
    with raw_socket(gateway) as socket:
        for lane in range(33):
            socket.send(
                json.dumps({"type": "response.create", "model": MODEL, "input": "thanks", "stream_id": f"l{lane}"})
            )
        refused, finished = [], set()
        while len(finished) < 32 or not refused:
            event = next_event(socket)
            if event["type"] == "error":
                refused.append(event)
            elif event["type"] in TERMINAL:
                finished.add(event["stream_id"])
    codes = [(e["status"], e["error"]["code"], e["stream_id"]) for e in refused]
    assert codes == [(400, "websocket_stream_limit_reached", "l32")]
    assert finished == {f"l{lane}" for lane in range(32)}


def test_a_drain_answers_the_creates_still_waiting_in_a_lane(tmp_path):
    live = LiveGateway(gateway_settings(tmp_path)).start()
    try:
        with raw_socket(live) as socket:
            for _ in range(2):  # the second waits behind the first on the one lane
                socket.send(json.dumps({"type": "response.create", "model": MODEL, "input": "say it slowly"}))
            assert next_event(socket)["type"] == "response.created"
            drain = threading.Thread(target=live.call, args=(live.services.lifecycle.drain(30), 40))
            drain.start()
            seen = []
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    seen.append(next_event(socket))
            kinds = [event["type"] for event in seen]
            assert "response.completed" in kinds and kinds.count("response.created") == 0
            errors = [event for event in seen if event["type"] == "error"]
            assert [(e["status"], e["error"]["code"]) for e in errors] == [(503, "server_shutting_down")]
            assert closed.value.rcvd.code == 1001
            drain.join(30)
    finally:
        live.stop()


def test_a_socket_holds_its_last_sixteen_responses(gateway):
    """Held responses are bounded (generate: false ones too): the oldest of seventeen is forgotten."""
    with raw_socket(gateway) as socket:
        ids = []
        for turn in range(17):
            body = {"type": "response.create", "model": MODEL, "input": f"turn {turn}", "generate": False}
            socket.send(json.dumps({**body, "store": False}))
            while (event := next_event(socket))["type"] != "response.completed":
                pass
            ids.append(event["response"]["id"])
        for previous, expected in ((ids[0], "error"), (ids[-1], "response.created")):
            socket.send(
                json.dumps(
                    {"type": "response.create", "model": MODEL, "input": "thanks", "previous_response_id": previous}
                )
            )
            first = next_event(socket)
            assert first["type"] == expected, first
            if expected == "error":
                assert first["status"] == 400 and first["error"]["code"] == "previous_response_not_found"
            else:
                while next_event(socket)["type"] not in TERMINAL:
                    pass


def test_a_large_message_is_parsed_off_the_loop_and_answered(gateway):
    """Past 64 KiB a message is the tenant's costly work (parsed in a worker thread); bad JSON is still a 400."""
    with raw_socket(gateway) as socket:
        socket.send(json.dumps({"type": "response.create", "model": MODEL, "input": "thanks " + "x" * 300_000}))
        kinds = []
        while not kinds or kinds[-1] not in TERMINAL:
            kinds.append(next_event(socket)["type"])
        assert kinds[-1] == "response.completed"
        socket.send('{"type": "response.create", "input": "' + "x" * 300_000)
        error = SERVER_EVENT.validate_python(next_event(socket))
        assert error.status == 400 and error.error.code == "invalid_json"
