"""Hosted MCP servers through the real `openai` SDK: tools listed and called within one response, approvals,
allow-lists, credentials kept out of storage and logs, both transports."""

from __future__ import annotations

import json

import openai
import pytest
from hosted_gateway import (
    MODEL,
    client,
    create,
    hosted_settings,
    mcp_tool,
    of,
)
from hosted_servers import McpTestServer
from live_gateway import LiveGateway


@pytest.mark.parametrize("stream", [False, True])
def test_an_mcp_server_is_listed_and_called_within_one_response(gateway, mcp_server, stream):
    api = client(gateway)
    tool = mcp_tool(mcp_server, require_approval="never", headers={"Authorization": "Bearer secret-token-123"})
    response, events = create(api, stream, input="add 2 and 3", tools=[tool])
    assert [item.type for item in response.output] == ["mcp_list_tools", "mcp_call", "message"]
    listing = response.output[0]
    assert listing.server_label == "calc" and {t.name for t in listing.tools} == {"add", "whoami", "fail"}
    call = response.output[1]
    assert (call.name, json.loads(call.arguments), call.output, call.status) == (
        "add",
        {"a": 2, "b": 3},
        "5",
        "completed",
    )
    assert response.output_text == "2 + 3 = 5"
    assert "namespace calc {" in gateway.backend.prompt_text()  # rendered as its own Harmony namespace
    if stream:
        kinds = [event.type for event in events]
        for kind in (
            "response.mcp_list_tools.in_progress",
            "response.mcp_list_tools.completed",
            "response.mcp_call.in_progress",
            "response.mcp_call_arguments.delta",
            "response.mcp_call_arguments.done",
            "response.mcp_call.completed",
        ):
            assert kind in kinds
    # secrets: not echoed, not stored, not logged
    stored = api.responses.retrieve(response.id)
    assert "headers" not in stored.tools[0].model_dump(exclude_unset=True)
    assert "secret-token-123" not in json.dumps(stored.model_dump(mode="json"))
    # the next turn does not list the tools again: the client holds the list
    follow, _ = create(api, False, input="add 2 and 3", tools=[tool], previous_response_id=response.id)
    assert [item.type for item in follow.output] == ["mcp_call", "message"]


def test_a_clients_token_reaches_the_mcp_server_and_a_failing_tool_is_an_mcp_error(memory_gateway, mcp_server):
    api = client(memory_gateway)
    tool = mcp_tool(mcp_server, require_approval="never", authorization="secret-token-123")
    response, _ = create(api, False, input="who am I", tools=[tool])
    assert of(response, "mcp_call")[0].output == "authorized"
    broken, _ = create(api, False, input="broken tool", tools=[tool])
    call = of(broken, "mcp_call")[0]
    assert call.status == "failed" and call.error.type == "mcp_tool_execution_error"
    assert broken.output_text == "The tool failed."


@pytest.mark.parametrize("approve", [True, False])
def test_an_approval_round_trip(gateway, mcp_server, approve):
    api = client(gateway)
    tool = mcp_tool(mcp_server)  # require_approval defaults to always, as OpenAI's
    calls_before = len(mcp_server.calls)
    first, _ = create(api, False, input="add 2 and 3", tools=[tool])
    request = of(first, "mcp_approval_request")[0]
    assert (request.name, json.loads(request.arguments), request.server_label) == ("add", {"a": 2, "b": 3}, "calc")
    assert len(mcp_server.calls) == calls_before  # nothing ran yet
    answer = {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": approve}
    second, _ = create(api, False, input=[answer], tools=[tool], previous_response_id=first.id)
    if approve:
        call = of(second, "mcp_call")[0]
        assert call.approval_request_id == request.id and call.output == "5"
        assert second.output_text == "2 + 3 = 5"
        assert mcp_server.calls[-1] == {"tool": "add", "a": 2, "b": 3}
    else:
        assert not of(second, "mcp_call") and second.output_text == "Understood, not adding."
        assert len(mcp_server.calls) == calls_before
    with pytest.raises(openai.BadRequestError) as again:  # an answered request cannot be answered twice
        api.responses.create(model=MODEL, input=[answer], tools=[tool], previous_response_id=second.id)
    assert again.value.body["param"] == "input[0].approval_request_id"


def test_an_mcp_url_outside_the_allow_list_is_a_400(memory_gateway, mcp_server):
    api = client(memory_gateway)
    for url in ("http://127.0.0.1:1/elsewhere", mcp_server.url + "-evil", "file:///etc/passwd"):
        with pytest.raises(openai.BadRequestError) as refused:
            api.responses.create(model=MODEL, input="add", tools=[{**mcp_tool(mcp_server), "server_url": url}])
        assert refused.value.body["param"] == "tools[0].server_url"


def test_an_approval_of_an_unknown_request_is_a_400(memory_gateway, mcp_server):
    answer = {"type": "mcp_approval_response", "approval_request_id": "mcpr_nothing", "approve": True}
    with pytest.raises(openai.BadRequestError) as refused:
        client(memory_gateway).responses.create(model=MODEL, input=[answer], tools=[mcp_tool(mcp_server)])
    assert refused.value.body["param"] == "input[0].approval_request_id"


def test_mcp_over_sse_too(tmp_path, web):
    server = McpTestServer(transport="sse").start()
    live = LiveGateway(hosted_settings(tmp_path, web, server.url)).start()
    try:
        tool = {"type": "mcp", "server_label": "calc", "server_url": server.url, "require_approval": "never"}
        response, _ = create(client(live), False, input="add 2 and 3", tools=[tool])
        assert of(response, "mcp_call")[0].output == "5" and response.output_text == "2 + 3 = 5"
    finally:
        live.stop()
        server.stop()


def test_tool_lists_are_cached_per_tenant_and_credentials_and_tokens_stay_out_of_logs(
    memory_gateway, mcp_server, capfd
):
    # approvals: the responses end at an approval request, so the only listings are the gateway's own (a tool
    # call lists too: the SDK checks the result against the tool's output schema)
    tool = mcp_tool(mcp_server, authorization="secret-token-123")
    api_a = client(memory_gateway)
    api_b = openai.OpenAI(base_url=memory_gateway.url + "/v1", api_key="sk-tenant-b", max_retries=0, timeout=60)
    before = mcp_server.listings
    for _ in range(3):
        create(api_a, False, input="who am I", tools=[tool])
    assert mcp_server.listings == before + 1  # listed once for tenant-a, then from the cache
    create(api_b, False, input="who am I", tools=[tool])
    assert mcp_server.listings == before + 2  # another tenant lists for itself
    create(api_a, False, input="who am I", tools=[{**tool, "authorization": "another-token"}])
    assert mcp_server.listings == before + 3  # other credentials, another list
    captured = capfd.readouterr()
    assert "secret-token-123" not in captured.out + captured.err
    assert "who am I" not in captured.out + captured.err  # nor prompts


def test_an_allowed_mcp_url_on_a_private_address_is_still_refused_unless_its_network_is_allowed(
    tmp_path, web, mcp_server
):
    settings = hosted_settings(tmp_path, web, mcp_server.url)
    hosted = settings.hosted_tools.model_copy(
        update={"outbound": settings.hosted_tools.outbound.model_copy(update={"allowed_private_networks": []})}
    )
    live = LiveGateway(settings.model_copy(update={"hosted_tools": hosted})).start()
    try:
        with pytest.raises(openai.APIStatusError) as refused:
            client(live).responses.create(model=MODEL, input="add", tools=[mcp_tool(mcp_server)])
        assert refused.value.status_code == 424
        assert refused.value.body["param"] == "tools[0].server_url"
        assert "may not reach" in refused.value.body["message"]
    finally:
        live.stop()
