"""Backends by name, through Python entry points (group `gpt_oss_gateway.backends`).

A plugin package declares, in its pyproject.toml:

    [project.entry-points."gpt_oss_gateway.backends"]
    mybackend = "my_package.module:create"

where `create(options: dict, encoding: HarmonyEncoding) -> Backend` builds one backend instance from the
options given in the gateway's configuration. Installing the package is all it takes.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points
from typing import Any, Protocol

from harmony import HarmonyEncoding

from .base import Backend

GROUP = "gpt_oss_gateway.backends"


class BackendFactory(Protocol):
    def __call__(self, options: dict[str, Any], encoding: HarmonyEncoding) -> Backend: ...


class UnknownBackend(ValueError):
    """No installed package provides a backend of that kind."""


class MissingRuntime(ValueError):
    """The backend's package is installed but a library it runs on is not (the engine without its extra)."""


ENGINE_EXTRA = "pip install 'gpt-oss-gateway[engine]'"


def missing_runtime_message(kind: str, missing: str) -> str:
    return (
        f"the '{kind}' backend needs {missing}, which is not installed: {ENGINE_EXTRA}"
        " (or serve a model server's models with GATEWAY_BACKEND=vllm, sglang or llamacpp)"
    )


def installed() -> dict[str, EntryPoint]:
    return {entry.name: entry for entry in entry_points(group=GROUP)}


def create_backend(kind: str, options: dict[str, Any], encoding: HarmonyEncoding) -> Backend:
    entry = installed().get(kind)
    if entry is None:
        names = ", ".join(sorted(installed())) or "none"
        raise UnknownBackend(f"no backend '{kind}' is installed (entry points in {GROUP}: {names})")
    try:
        factory: BackendFactory = entry.load()
    except ModuleNotFoundError as exc:
        raise MissingRuntime(missing_runtime_message(kind, exc.name or str(exc))) from None
    return factory(options, encoding)
