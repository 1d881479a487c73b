"""Pydantic models of the Responses API request, grouped as its reference groups them: input items
(`items`), tools and tool choice (`tools`), the create and compact bodies with their options (`request`), and what
they share (`common`). What a response returns is in shape.py."""
