"""Compiled kernels for the engine's custom ops (C++ sources here, built on first use by build.py)."""
