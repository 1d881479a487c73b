"""Service tiers through the `openai` SDK against a live gateway: the tier applied is the one asked for when the
tenant is allowed it, else the tenant's `auto` tier; it is echoed on both APIs (streamed chunks included), reaches
the backend, and is on the usage ledger's record; a backend that cannot schedule by tier echoes `default`."""

from __future__ import annotations

import json
import urllib.request

import openai
import pytest
from gateway_fixtures import SCRIPT, gateway_settings, write_keys
from live_gateway import LiveGateway

from gateway.tenants.limits import LimitsConfig

MODEL = "gpt-oss-120b"
KEYS = {"sk-gold": "gold", "sk-plain": "plain", "sk-batchy": "batchy", "sk-ops": "ops"}
LIMITS = {
    "tenants": {
        "gold": {"service_tiers": ["priority", "default", "flex"]},
        "batchy": {"service_tiers": ["flex"], "auto_service_tier": "flex"},
    }
}


@pytest.fixture
def live(tmp_path):
    settings = gateway_settings(
        tmp_path,
        {**SCRIPT, "service_tiers": True},
        limits=LimitsConfig.model_validate(LIMITS),
        admin_tenants=["ops"],
    )
    settings = settings.model_copy(update={"keys_file": str(write_keys(tmp_path, KEYS))})
    gateway = LiveGateway(settings).start()
    yield gateway
    gateway.stop()


def _client(live: LiveGateway, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live.url}/v1", api_key=key, max_retries=0, timeout=30)


@pytest.mark.parametrize(
    ("key", "asked", "applied"),
    [
        ("sk-gold", "priority", "priority"),
        ("sk-gold", "fast", "priority"),  # OpenAI answers priority for fast
        ("sk-gold", "flex", "flex"),
        ("sk-gold", None, "default"),
        ("sk-plain", "priority", "default"),  # not allowed: the tenant's auto tier, echoed so
        ("sk-plain", "flex", "flex"),
        ("sk-plain", "scale", "default"),
        ("sk-batchy", "auto", "flex"),
        ("sk-batchy", "default", "flex"),
    ],
)
def test_the_tier_applied_is_echoed_on_both_apis_and_reaches_the_backend(live, key, asked, applied):
    client = _client(live, key)
    tier = {} if asked is None else {"service_tier": asked}
    response = client.responses.create(model=MODEL, input="thanks", **tier)
    assert response.service_tier == applied and live.backend.tiers[-1] == applied
    completion = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "thanks"}], **tier)
    assert completion.service_tier == applied and live.backend.tiers[-1] == applied
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "thanks"}], stream=True, **tier
        )
    )
    assert chunks and {chunk.service_tier for chunk in chunks} == {applied}
    events = list(client.responses.create(model=MODEL, input="thanks", stream=True, **tier))
    assert events[-1].type == "response.completed" and events[-1].response.service_tier == applied


def test_the_usage_ledger_records_the_tier_each_answer_ran_at(live):
    client = _client(live, "sk-gold")
    fast = client.responses.create(model=MODEL, input="thanks", service_tier="priority")
    cheap = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "thanks"}], service_tier="flex"
    )
    request = urllib.request.Request(
        f"{live.url}/v1/usage/records?tenant=gold", headers={"Authorization": "Bearer sk-ops"}
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        records = {record["response_id"]: record for record in json.loads(answer.read())["data"]}
    assert records[fast.id]["service_tier"] == "priority"
    assert records[cheap.id]["service_tier"] == "flex"


def test_a_backend_that_cannot_schedule_by_tier_echoes_default(tmp_path):
    live = LiveGateway(gateway_settings(tmp_path)).start()
    try:
        client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="sk-tenant-a", max_retries=0, timeout=30)
        assert client.responses.create(model=MODEL, input="thanks", service_tier="flex").service_tier == "default"
        completion = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "thanks"}], service_tier="priority"
        )
        assert completion.service_tier == "default"
    finally:
        live.stop()


def test_an_auto_tier_outside_the_tenant_s_tiers_is_refused_at_start():
    with pytest.raises(ValueError, match="auto_service_tier"):
        LimitsConfig.model_validate({"tenants": {"x": {"service_tiers": ["priority"]}}})
