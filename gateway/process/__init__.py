"""The serving process: its event loop (uvloop or asyncio) and its lifecycle (listening, readiness, graceful drain)."""
