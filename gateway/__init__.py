"""The gpt-oss-gateway HTTP application."""
