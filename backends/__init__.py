"""Inference backends: the Backend protocol, registry and implementations."""
