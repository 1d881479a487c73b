"""The local Python sandbox: the pool the gateway uses, the worker that confines itself, and what confines it."""

from .pool import CellResult, Isolation, SandboxPool, SandboxSettings, SandboxUnavailable

__all__ = ["CellResult", "Isolation", "SandboxPool", "SandboxSettings", "SandboxUnavailable"]
