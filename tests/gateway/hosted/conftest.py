"""The fixtures of the hosted-tool tests: a live gateway with every tool on, a real MCP server, fake web sites."""

from hosted_gateway import gateway, mcp_server, memory_gateway, web  # noqa: F401
