"""Continuations over the Responses WebSocket fail the way clients recover from, through the SDK's
`responses.connect()`: a `previous_response_id` the socket cannot resolve is an `error` event with OpenAI's
`previous_response_not_found` (400, `param: previous_response_id`, the create's `stream_id`) and the socket stays
usable; a continuation that fails evicts what it named; every error event validates as the SDK's
`ResponseWsError`; and a socket past its lifetime finishes what runs, refuses what waits with
`websocket_connection_limit_reached`, and closes."""

from __future__ import annotations

import json

import pytest
from gateway_fixtures import WEATHER_TOOL, gateway_settings
from live_gateway import LiveGateway
from openai.types.responses.responses_server_event import ResponseWsError
from responses_socket import TERMINAL, api_client, next_event, raw_socket, until_answered, until_done
from websockets.exceptions import ConnectionClosed

MODEL = "gpt-oss-120b"


def _missing(events: list, lane: str | None = None) -> None:
    """The create was refused with `previous_response_not_found`, as OpenAI answers it."""
    [error] = events
    assert isinstance(error, ResponseWsError), error
    assert error.status == 400 and error.stream_id == lane
    assert error.error.code == "previous_response_not_found" and error.error.type == "invalid_request_error"
    assert error.error.param == "previous_response_id" and error.error.message


def test_an_unresolvable_previous_response_is_previous_response_not_found_and_the_socket_goes_on(gateway):
    """Unknown, deleted, another tenant's, and a `store: false` response held by a socket since closed."""
    api = api_client(gateway)
    stored = api.responses.create(model=MODEL, input="Say hello")
    deleted = api.responses.create(model=MODEL, input="Say hello")
    api.responses.delete(deleted.id)
    foreign = api_client(gateway, "sk-tenant-b").responses.create(model=MODEL, input="Say hello")
    with api.responses.connect() as old:
        old.response.create(model=MODEL, input="thanks", store=False)
        closed_with_its_socket = until_done(old)[-1].response.id
    with api.responses.connect() as connection:
        for missing in ("resp_missing", deleted.id, foreign.id, closed_with_its_socket):
            connection.response.create(model=MODEL, input="hi", previous_response_id=missing, stream_id="agent-1")
            _missing(until_answered(connection), "agent-1")
        connection.response.create(model=MODEL, input="thanks", previous_response_id=stored.id)
        assert until_answered(connection)[-1].type == "response.completed"  # the socket still serves


def test_a_refused_continuation_evicts_the_response_it_named(gateway):
    """The Open Responses suite's case: an output for a call the previous response never made."""
    with api_client(gateway).responses.connect() as connection:
        connection.response.create(model=MODEL, input="thanks", store=False)
        first = until_done(connection)[-1].response.id
        orphan = {"type": "function_call_output", "call_id": "call_missing", "output": "sunny"}
        connection.response.create(model=MODEL, input=[orphan], previous_response_id=first, store=False)
        [refused] = until_answered(connection)
        assert isinstance(refused, ResponseWsError) and refused.status == 400
        assert refused.error.param == "input[0].call_id"
        connection.response.create(model=MODEL, input="again", previous_response_id=first, store=False)
        _missing(until_answered(connection))


def test_a_continuation_that_ends_failed_evicts_its_chain_and_is_not_held(gateway):
    """A response that fails mid-stream (the mock cannot enforce `tool_choice: required`): its `error` event is
    the socket's error type, and neither it nor the response it continued can be continued on the socket."""
    with api_client(gateway).responses.connect() as connection:
        connection.response.create(model=MODEL, input="thanks", store=False)
        first = until_done(connection)[-1].response.id
        connection.response.create(
            model=MODEL,
            input="Say hello",
            previous_response_id=first,
            store=False,
            tools=[WEATHER_TOOL],
            tool_choice="required",
        )
        events = until_answered(connection)
        error, failed = events[-2:]
        assert isinstance(error, ResponseWsError) and error.status is None and error.sequence_number
        assert error.error.type == "server_error" and error.error.code == "constraint_not_enforced"
        assert failed.type == "response.failed"
        for named in (first, failed.response.id):
            connection.response.create(model=MODEL, input="again", previous_response_id=named, store=False)
            _missing(until_answered(connection))


def test_a_socket_past_its_lifetime_finishes_what_runs_refuses_what_waits_and_closes(tmp_path):
    live = LiveGateway(gateway_settings(tmp_path, ws_max_age_s=1.0)).start()
    try:
        with raw_socket(live) as socket:
            for text in ("say it slowly", "thanks"):  # the second waits behind the first on the default lane
                socket.send(json.dumps({"type": "response.create", "model": MODEL, "input": text}))
            events = []
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    events.append(next_event(socket))
        ends = [event for event in events if event["type"] in (*TERMINAL, "error")]
        assert [event["type"] for event in ends] == ["error", "response.completed"]  # refused while the first ran
        refused = ResponseWsError.model_validate(ends[0])
        assert refused.status == 400 and refused.error.code == "websocket_connection_limit_reached"
        assert ends[1]["response"]["output"][-1]["content"][0]["text"] == "done slowly"
        assert closed.value.rcvd.code == 1000 and closed.value.rcvd.reason == "websocket_connection_limit_reached"
    finally:
        live.stop()
