"""Hosted web search as Harmony's browser, through the real `openai` SDK: SearXNG and Brave as providers,
cited pages, and page fetches held to the outbound policy and their bounds."""

from __future__ import annotations

import asyncio
import time

import pytest
from gateway_fixtures import write_script
from hosted_gateway import (
    SEARCH_TOOL,
    client,
    create,
    hosted_settings,
    of,
)
from live_gateway import LiveGateway
from loop_probe import slowest_healthz_during

from gateway.config import load_settings
from gateway.hosted.outbound import OutboundSettings


@pytest.mark.parametrize("stream", [False, True])
def test_web_search_runs_as_harmonys_browser_and_cites_pages(gateway, web, stream):
    api = client(gateway)
    response, events = create(
        api,
        stream,
        input="search the web: what causes tides?",
        tools=[SEARCH_TOOL],
        include=["web_search_call.action.sources"],
    )
    searches = of(response, "web_search_call")
    assert [call.action.type for call in searches] == ["search", "open_page"]
    assert searches[0].action.query == "what causes tides" and web.queries[-1] == "what causes tides"
    assert searches[1].action.url == f"{web.url}/pages/tides"
    assert all(call.status == "completed" for call in searches)
    message = of(response, "message")[0]
    text = message.content[0].text
    assert text == "The Moon causes tides【1†L2】."
    (citation,) = message.content[0].annotations
    assert citation.type == "url_citation" and citation.url == f"{web.url}/pages/tides"
    assert text[citation.start_index : citation.end_index] == "【1†L2】"
    prompt = gateway.backend.prompt_text()
    assert (
        "<|start|>browser.search to=assistant<|channel|>analysis<|message|>[0] Search results for `what causes tides`"
        in prompt
    )
    assert "L2: Tides are caused mainly by the gravity of the Moon." in prompt  # the page, as numbered lines
    assert "var x" not in prompt  # scripts are not page text
    if stream:
        kinds = [event.type for event in events]
        for kind in ("in_progress", "searching", "completed"):
            assert kinds.count(f"response.web_search_call.{kind}") == 2
        assert "response.output_text.annotation.added" in kinds


def test_the_browser_does_not_reach_addresses_the_operator_did_not_allow(memory_gateway):
    api = client(memory_gateway)
    response, _ = create(api, False, input="read the cloud metadata", tools=[SEARCH_TOOL])
    (call,) = of(response, "web_search_call")
    assert call.status == "failed"
    assert "may not reach" in memory_gateway.backend.prompt_text()


def test_a_host_name_the_policy_refuses_is_reported_with_the_policys_reason(tmp_path, web, mcp_server):
    """`localhost` is refused while aiohttp resolves it: the model reads why, not a DNS error's class name."""
    settings = hosted_settings(tmp_path, web, mcp_server.url)
    hosted = settings.hosted_tools.model_copy(update={"outbound": OutboundSettings()})  # no private network
    live = LiveGateway(settings.model_copy(update={"hosted_tools": hosted})).start()
    try:
        response, _ = create(client(live), False, input="open localhost", tools=[SEARCH_TOOL])
        (call,) = of(response, "web_search_call")
        assert call.status == "failed"
        answer = live.backend.prompt_text().rsplit("<|start|>browser.open to=assistant", 1)[1]
        assert "localhost resolves to an address this gateway may not reach" in answer
        assert "could not be fetched" not in answer
    finally:
        live.stop()


@pytest.mark.parametrize("page", ["unclosed", "deep"])
def test_a_hostile_page_neither_stalls_the_gateway_nor_its_answer(tmp_path, web, mcp_server, page):
    """Pages built to make an HTML parser quadratic are read off the event loop, in bounded time."""
    call = f'<|channel|>analysis to=browser.open code<|message|>{{"id": "{web.url}/pages/{page}"}}<|call|>'
    script = {"rules": [{"match": {"tool": "."}, "emit": [{"final": "Read it."}]}, {"emit": [{"raw": call}]}]}
    settings = hosted_settings(tmp_path, web, mcp_server.url)
    live = LiveGateway(settings.model_copy(update={"mock_script": str(write_script(tmp_path, script))})).start()
    try:
        started = time.monotonic()
        (response, _), slowest = slowest_healthz_during(
            live.url, lambda: create(client(live), False, input="open the page", tools=[SEARCH_TOOL])
        )
        took = time.monotonic() - started
    finally:
        live.stop()
    (opened,) = of(response, "web_search_call")
    assert opened.status == "completed" and response.output_text == "Read it."
    assert took < 15, took
    assert slowest < 0.5, slowest  # /healthz answered throughout


def test_settings_name_what_a_search_provider_lacks():
    with pytest.raises(ValueError, match=r"GATEWAY_HOSTED_TOOLS.*searxng provider needs"):
        load_settings(hosted_tools={"web_search": {"provider": "searxng"}})


def test_brave_search_api_is_the_hosted_provider(web):
    from gateway.hosted.search import BraveProvider, SearchFailed
    from gateway.hosted.settings import SearchSettings

    async def search(key: str) -> list:
        provider = BraveProvider(SearchSettings(provider="brave", url=web.url + "/res/v1", api_key=key))
        try:
            return await provider.search("tides", 3)
        finally:
            await provider.aclose()

    results = asyncio.run(search("brave-key"))
    assert [r.url for r in results] == [f"{web.url}/pages/{i}" for i in range(3)] and web.queries[-1] == "tides"
    with pytest.raises(SearchFailed, match="HTTP 401"):
        asyncio.run(search("wrong-key"))


def test_page_fetches_are_bounded_and_every_redirect_hop_is_checked(web):
    from gateway.hosted.outbound import OutboundPolicy, OutboundRefused, OutboundSettings, PageFetcher

    settings = OutboundSettings(allowed_private_networks=["127.0.0.0/8"], max_page_bytes=100_000)
    fetcher = PageFetcher(OutboundPolicy.from_settings(settings), settings)

    async def fetch(path: str):
        return await fetcher.fetch(web.url + path)

    async def scenario() -> None:
        try:
            big = await fetch("/pages/big")
            assert big.truncated and len(big.text.encode()) == 100_000
            with pytest.raises(OutboundRefused, match="may not reach"):  # 127.0.0.1 allowed, 169.254 not
                await fetch("/pages/redirect")
        finally:
            await fetcher.aclose()

    asyncio.run(scenario())


def test_reading_a_page_past_its_time_budget_cuts_it_and_says_so():
    from gateway.hosted.html_text import html_to_text

    page = "<html><body>" + "<p>line</p>" * 50_000
    whole = html_to_text(page, "http://x/")
    assert not whole.cut and whole.text.count("line") == 50_000
    cut = html_to_text(page, "http://x/", budget_s=0.0)
    assert cut.cut and cut.text.count("line") < 50_000
