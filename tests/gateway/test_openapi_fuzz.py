"""schemathesis against the served /openapi.json: requests generated from the document itself, valid and
invalid, sent to a live gateway; none gets a 5xx, and every answer matches what the document declares.
The hypothesis profile sets the examples per operation (HYPOTHESIS_PROFILE=deep for a long run)."""

from __future__ import annotations

import json

import pytest
import schemathesis
from gateway_fixtures import write_script
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from live_gateway import LiveGateway
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import content_type_conformance, response_schema_conformance

from gateway.config import Settings
from gateway.openapi import openapi_document

MODEL = "gpt-oss-120b"
SCRIPT = {
    "rules": [
        {"match": {"user": "weather"}, "emit": [{"tool_call": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
        {"emit": [{"analysis": "Answer briefly."}, {"final": "Fine."}]},
    ]
}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    script = write_script(tmp_path_factory.mktemp("fuzz"), SCRIPT)
    settings = Settings(backend="mock", mock_script=str(script), admin_tenants=["default"])  # the usage records too
    gateway = LiveGateway(settings).start()
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def served_schema(served):
    return schemathesis.openapi.from_url(served.url + "/openapi.json")


def _cases() -> list[tuple[str, str, GenerationMode]]:
    """Every operation with valid input; those with a body or query parameters also with invalid input (a bare
    path string cannot be made invalid)."""
    cases = []
    for path, methods in openapi_document()["paths"].items():
        for method, spec in methods.items():
            cases.append((path, method, GenerationMode.POSITIVE))
            if "requestBody" in spec or any(p["in"] == "query" for p in spec.get("parameters", [])):
                cases.append((path, method, GenerationMode.NEGATIVE))
    return cases


CASES = _cases()


@pytest.mark.parametrize(("path", "method", "mode"), CASES, ids=[f"{m.upper()} {p} {g}" for p, m, g in CASES])
def test_generated_requests_never_get_a_5xx(served, served_schema, path, method, mode):
    operation = served_schema[path][method]
    checks = [not_a_server_error, content_type_conformance, response_schema_conformance]

    @given(case=operation.as_strategy(generation_mode=mode), served_model=st.booleans())
    @settings(
        max_examples=max(10, settings().max_examples // 5), database=None, suppress_health_check=list(HealthCheck)
    )
    def check(case, served_model):
        if served_model and isinstance(case.body, dict) and "model" in case.body:
            case.body["model"] = MODEL  # past the model lookup, into the request's translation and generation
        response = case.call(base_url=served.url, timeout=30)
        assert response.status_code < 500, f"{case.method} {case.formatted_path}: {response.text[:500]}"
        case.validate_response(response, checks=checks)

    check()


def test_the_document_is_what_schemathesis_loads(served):
    loaded = schemathesis.openapi.from_url(served.url + "/openapi.json")
    operations = {f"{op.ok().method.upper()} {op.ok().path}" for op in loaded.get_all_operations()}
    assert {"POST /v1/responses", "POST /v1/chat/completions", "GET /v1/responses/{response_id}"} <= operations
    assert json.loads(json.dumps(loaded.raw_schema))["openapi"] == "3.1.0"
