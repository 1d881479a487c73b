"""Large bodies are checked in low-priority checker processes before the gateway spends its own time on them:
the same answers as the gateway's own threads give, from a process at nice 10 within an address-space bound,
answering also while every CPU is busy;
a checker that dies is replaced and its request still answered; a check that runs out of memory is a 413, one
that fails of itself leaves the request to the gateway; the pool holds at most its size of processes."""

from __future__ import annotations

import functools
import gzip
import json
import multiprocessing
import os
import resource
import signal
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from checker_checks import allocate, broken
from gateway_fixtures import KEY_SECRET, write_keys
from live_gateway import GatewayProcess

from gateway.errors import ApiError
from gateway.intake.checker_pool import CheckerLost, CheckerPool

MODEL = "gpt-oss-120b"
SCRIPT = {"rules": [{"emit": [{"final": "ok"}]}]}


def _gateway(directory: Path, checkers: bool) -> GatewayProcess:
    directory.mkdir()
    (directory / "script.json").write_text(json.dumps(SCRIPT))
    env = {
        "GATEWAY_MOCK_SCRIPT": str(directory / "script.json"),
        "GATEWAY_KEY_SECRET": KEY_SECRET,
        "GATEWAY_KEYS_FILE": str(write_keys(directory)),
        "GATEWAY_REQUEST_CHECKERS": "1" if checkers else "0",
    }
    return GatewayProcess(env, directory / "gateway.log").start()


@pytest.fixture(scope="module")
def gateways(tmp_path_factory):
    directory = tmp_path_factory.mktemp("checkers")
    with_checkers, threads_only = _gateway(directory / "on", True), _gateway(directory / "off", False)
    yield with_checkers, threads_only
    for gateway in (with_checkers, threads_only):
        gateway.stop()
        assert "Traceback" not in gateway.log_text()


def _post(gateway: GatewayProcess, path: str, body: bytes, encoding: str = "identity") -> tuple[int, dict]:
    headers = {"Authorization": "Bearer sk-tenant-a", "Content-Type": "application/json"}
    if encoding != "identity":
        headers["Content-Encoding"] = encoding
    request = urllib.request.Request(gateway.url + path, data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _tools(count: int, properties: int) -> list[dict]:
    fields = {f"field_{n}": {"type": "string", "description": "d" * 30} for n in range(properties)}
    return [{"type": "function", "name": f"tool_{n}", "parameters": {"type": "object", "properties": fields}}
            for n in range(count)]  # fmt: skip


def _chat_tools(count: int, properties: int) -> list[dict]:
    return [{"type": "function", "function": {"name": t["name"], "parameters": t["parameters"]}}
            for t in _tools(count, properties)]  # fmt: skip


BIG = "x" * 70_000  # past the 64 KiB a body needs to go to a checker
OVERFLOWING = {"model": MODEL, "input": "hi", "tools": _tools(40, 1_200)}
CHAT_STORED = {"model": MODEL, "store": True, "messages": [{"role": "user", "content": BIG}]}
CHAT_OVERFLOWING = {"model": MODEL, "tools": _chat_tools(40, 1_200), "messages": [{"role": "user", "content": "hi"}]}
REFUSED = {
    "invalid JSON": ("/v1/responses", b'{"model": "' + BIG.encode() + b'", "input": ['),
    "lone surrogate": ("/v1/responses", json.dumps({"model": MODEL, "input": BIG + "\ud800"}).encode()),
    "unknown model": ("/v1/responses", json.dumps({"model": "nope", "input": BIG}).encode()),
    "bad parameter": ("/v1/responses", json.dumps({"model": MODEL, "input": BIG, "temperature": "hot"}).encode()),
    "background without store": (
        "/v1/responses",
        json.dumps({"model": MODEL, "input": BIG, "background": True, "store": False}).encode(),
    ),
    "schema past a limit": (
        "/v1/responses",
        json.dumps({"model": MODEL, "input": "hi", "tools": _tools(1, 5_001)}).encode(),
    ),
    "context overflow": ("/v1/responses", json.dumps(OVERFLOWING).encode()),
    "chat store": ("/v1/chat/completions", json.dumps(CHAT_STORED).encode()),
    "chat context overflow": ("/v1/chat/completions", json.dumps(CHAT_OVERFLOWING).encode()),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_checker_refuses_as_the_gateways_own_threads_do(gateways, case):
    path, body = REFUSED[case]
    answers = [_post(gateway, path, body) for gateway in gateways]
    assert answers[0] == answers[1] and 400 <= answers[0][0] < 500, answers
    assert answers[0] == _post(gateways[0], path, gzip.compress(body), "gzip")  # inflated by the checker


@pytest.mark.parametrize("fitting", [{"context_management": [{"type": "compaction"}]}, {"truncation": "auto"}])
def test_a_prompt_that_compaction_or_truncation_may_fit_is_answered_as_the_request_path_answers(gateways, fitting):
    """Past the context as sent: the checker leaves it to the request path (which may compact or truncate), so
    the answer is the one the gateway's own threads give."""
    words = " ".join(f"w{n}" for n in range(8_000))  # about 20k tokens a turn: 7 turns pass the context
    turns = [{"role": "user", "content": f"turn {n}: {words}"} for n in range(7)]
    body = json.dumps({"model": MODEL, "input": turns, "max_output_tokens": 16, **fitting}).encode()
    (status, answer), (expected_status, expected) = (_post(gateway, "/v1/responses", body) for gateway in gateways)
    assert status == expected_status
    assert answer.get("error") == expected.get("error") and answer.get("status") == expected.get("status")


def test_a_large_body_a_checker_passes_is_served_whole(gateways):
    body = {"model": MODEL, "input": "hi", "tools": _tools(3, 400), "metadata": {"k": "v"}}
    answers = [_post(gateway, "/v1/responses", json.dumps(body).encode()) for gateway in gateways]
    for status, response in answers:
        assert status == 200, response
        assert response["tools"][2]["parameters"] == body["tools"][2]["parameters"]
    assert answers[0][1]["usage"]["input_tokens"] == answers[1][1]["usage"]["input_tokens"]


def _checkers_of(gateway: GatewayProcess) -> list[int]:
    tasks = Path(f"/proc/{gateway.process.pid}/task").glob("*/children")  # each thread's own children
    children = [pid for task in tasks for pid in task.read_text().split()]
    return [int(pid) for pid in children if "spawn_main" in _cmdline(int(pid))]  # not the resource tracker


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_checkers_run_at_the_lowest_priority_within_an_address_space_bound(gateways):
    with_checkers, threads_only = gateways
    _post(with_checkers, *REFUSED["context overflow"])
    checkers = _checkers_of(with_checkers)
    assert checkers, "a large body started a checker process"
    for pid in checkers:
        assert os.sched_getscheduler(pid) == os.SCHED_BATCH
        assert os.getpriority(os.PRIO_PROCESS, pid) == 10
        soft, hard = resource.prlimit(pid, resource.RLIMIT_AS)
        assert soft == hard < 4 * 1024**3
    _post(threads_only, *REFUSED["context overflow"])
    assert not _checkers_of(threads_only)


def _spin(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pass


def test_a_checker_answers_while_every_cpu_is_busy(gateways):
    """At SCHED_IDLE a checker got no CPU at all beside busy threads and its request waited out the check's
    60 s; at nice 10 it gets a tenth of a CPU and answers."""
    with_checkers, _ = gateways
    path, body = REFUSED["context overflow"]
    _post(with_checkers, path, body)  # a checker started and ready
    log_before = with_checkers.log_text()
    spinners = [multiprocessing.Process(target=_spin, args=(40,)) for _ in range(os.cpu_count() or 2)]
    for spinner in spinners:
        spinner.start()
    try:
        started = time.monotonic()
        status, answer = _post(with_checkers, path, gzip.compress(body), "gzip")
        waited = time.monotonic() - started
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.join()
    assert status == 400 and answer["error"]["code"] == "context_length_exceeded", answer
    assert waited < 20, waited  # 0.4 s on an idle host; 4.5 s beside busy CPUs at nice 10, 32 s at nice 19
    assert "request_checker_lost" not in with_checkers.log_text()[len(log_before) :]


def test_a_dead_checker_is_replaced_and_its_request_still_answered(gateways):
    with_checkers, threads_only = gateways
    path, body = REFUSED["context overflow"]
    expected = _post(threads_only, path, body)
    _post(with_checkers, path, body)
    for pid in _checkers_of(with_checkers):
        os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)
    assert _post(with_checkers, path, body) == expected  # the threads answered it
    assert _post(with_checkers, path, body) == expected  # a new checker did
    assert _checkers_of(with_checkers)
    assert "request_checker_lost" in with_checkers.log_text()


@pytest.fixture
def one_checker():
    """A pool of one checker process, and how many processes this one had started before it."""
    before = len(multiprocessing.active_children())
    pool = CheckerPool(None, max_body_bytes=1024, size=1)
    yield pool, before
    pool.close()


def test_a_check_past_the_checkers_memory_bound_is_a_413_and_the_checker_lives_on(one_checker):
    pool, _ = one_checker
    with pytest.raises(ApiError) as refused:
        pool.call(b"{}", "identity", 1024, functools.partial(allocate, mib=8 * 1024))
    assert refused.value.status == 413 and refused.value.code == "request_too_large"
    raw = b'{"a": [1, 2.5, "x", null, true]}'
    accepted = pool.call(raw, "identity", 1024, functools.partial(allocate, mib=1))
    assert accepted.body == {"a": [1, 2.5, "x", None, True]} and accepted.size == len(raw)


def test_callers_past_the_pools_size_wait_for_its_checker(one_checker):
    pool, before = one_checker
    with ThreadPoolExecutor(3) as threads:
        bodies = [json.dumps({"n": n}).encode() for n in range(6)]
        answers = list(threads.map(lambda raw: pool.call(raw, "identity", 1024, None), bodies))
    assert [answer.body for answer in answers] == [{"n": n} for n in range(6)]
    assert len(multiprocessing.active_children()) - before == 1


def test_a_check_that_fails_of_itself_leaves_the_request_to_the_gateway_and_the_checker_alive(one_checker):
    pool, before = one_checker
    with pytest.raises(CheckerLost, match="ValueError"):
        pool.call(b"{}", "identity", 1024, broken)
    assert pool.call(b"[1]", "identity", 1024, None).body == [1]
    assert len(multiprocessing.active_children()) - before == 1  # the same process answered
