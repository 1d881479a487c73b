"""Costly work (large bodies and schemas): one tenant's pieces run one at a time while another tenant's run
beside them, a tenant with a full queue gets a 429, and a piece that paces gives the event loop its turns."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from gateway.errors import ApiError
from gateway.intake.costly_work import MAX_WAITING, PER_TENANT, CostlyWork
from gateway.intake.pacing import pace


def _hold(gate: threading.Event, log: list[str], name: str):
    def work() -> str:
        log.append(f"{name} start")
        gate.wait(5)
        log.append(f"{name} end")
        return name

    return work


def test_one_tenants_pieces_queue_behind_each_other_not_in_front_of_another_tenants():
    async def scenario() -> list[str]:
        costly, log, gate = CostlyWork(total=4), [], threading.Event()
        first = asyncio.ensure_future(costly.run("a", _hold(gate, log, "a1")))
        second = asyncio.ensure_future(costly.run("a", _hold(gate, log, "a2")))
        await asyncio.sleep(0.1)
        other = await costly.run("b", lambda: "b ran")  # while a1 holds tenant a's only place
        log.append(other)
        gate.set()
        await asyncio.gather(first, second)
        return log

    log = asyncio.run(scenario())
    assert PER_TENANT == 1 and log.index("b ran") < log.index("a1 end") < log.index("a2 start")


def test_a_tenant_past_its_queue_gets_a_429():
    async def scenario() -> ApiError:
        costly, gate = CostlyWork(total=2), threading.Event()
        held = [asyncio.ensure_future(costly.run("a", _hold(gate, [], f"a{n}"))) for n in range(1 + MAX_WAITING)]
        await asyncio.sleep(0.05)
        with pytest.raises(ApiError) as refused:
            await costly.run("a", lambda: None)
        assert costly.waiting("a") == 1 + MAX_WAITING and costly.waiting("b") == 0
        gate.set()
        await asyncio.gather(*held)
        assert costly.waiting("a") == 0
        return refused.value

    refused = asyncio.run(scenario())
    assert refused.status == 429 and refused.code == "rate_limit_exceeded"


def test_costly_work_that_paces_waits_for_the_loops_turns():
    """While the loop is busy (here: 0.3 s in one blocking call), a pacing worker mostly waits for its turn; it
    runs at full speed while the loop is free."""
    seen = {"busy": False, "while_busy": 0, "while_free": 0}

    def spin() -> None:
        until = time.perf_counter() + 0.9
        while time.perf_counter() < until:
            pace()
            seen["while_busy" if seen["busy"] else "while_free"] += 1

    async def scenario() -> None:
        work = asyncio.ensure_future(CostlyWork(total=1).run("a", spin))
        await asyncio.sleep(0.3)
        seen["busy"] = True
        time.sleep(0.3)  # the loop runs nothing else meanwhile
        seen["busy"] = False
        await work

    asyncio.run(scenario())
    assert seen["while_busy"] < 0.2 * seen["while_free"] / 2  # per second: under a fifth of its free rate
