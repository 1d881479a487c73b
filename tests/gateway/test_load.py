"""The load test in small form: concurrent SSE streams against a `serve` process all complete, with every
token, no errors, and the streams gauge back at 0 afterwards (bench/load_test.py runs 500)."""

from __future__ import annotations

import asyncio
import json
import time

from live_gateway import GatewayProcess
from sse_load import active_streams, mock_script, run_load

ANSWER = " ".join(f"word{i}" for i in range(40))


def test_a_hundred_concurrent_streams_complete_without_errors(tmp_path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps(mock_script(ANSWER, delay_ms=5)))
    env = {"GATEWAY_BACKEND": "mock", "GATEWAY_MOCK_SCRIPT": str(script), "GATEWAY_METRICS_PUBLIC": "true"}
    gateway = GatewayProcess(env, tmp_path / "gateway.log").start()
    try:
        result = asyncio.run(run_load(gateway.url, 100, "gpt-oss-120b", timeout_s=120))
        assert result.errors == []
        counts = {stream.deltas for stream in result.streams}
        assert len(counts) == 1 and counts.pop() >= 40  # every stream got the whole answer
        assert result.ttft["p99"] < 10 and result.inter_token["p50"] < 1
        deadline = time.monotonic() + 5
        while active_streams(gateway.url) != 0:
            assert time.monotonic() < deadline, "the streams gauge did not return to 0"
            time.sleep(0.05)
    finally:
        gateway.stop()
