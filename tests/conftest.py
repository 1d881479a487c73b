from __future__ import annotations

import os
import sys

import pytest
from hypothesis import HealthCheck, settings

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "support"))  # the tests' shared helpers
# The gateway's own tests run on the scripted mock backend (serve processes inherit this too);
# engine/test_engine_default.py removes it to check that `serve` runs the built-in engine by default.
os.environ["GATEWAY_BACKEND"] = "mock"

from gateway_fixtures import gateway, redis_server  # noqa: F401  (fixtures shared by the API tests)
from machine_state import machine_state_lines
from unprivileged import shared_dir  # noqa: F401  (a directory an unprivileged gateway can read)

from harmony import Renderer, load_harmony_encoding

settings.register_profile("default", max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("deep", max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture(scope="session")
def encoding():
    return load_harmony_encoding()


@pytest.fixture(scope="session")
def renderer(encoding):
    return Renderer(encoding)


@pytest.fixture(scope="session")
def tok(encoding):
    return encoding.encode_marked


def pytest_report_header() -> list[str]:
    return machine_state_lines()


def pytest_terminal_summary(terminalreporter) -> None:
    """The machine's state again at the end: a run that went slow or failed en masse shows whether it was starved."""
    for line in machine_state_lines():
        terminalreporter.write_line(line)
