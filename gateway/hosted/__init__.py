"""Tools the gateway runs for the model inside one response: MCP servers, web search (Harmony's browser)
and Python (Harmony's python, in a local sandbox)."""
