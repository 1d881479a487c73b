"""Bounds on request sizes (OWASP API4): every list, map and string a client sends is capped."""

MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_INPUT_ITEMS = 4096
MAX_TOOLS = 128
MAX_METADATA_KEYS = 16
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512
MAX_CLIENT_METADATA_CHARS = 16_384  # client_metadata, keys and values together (Codex sends ~1 KB)
MAX_GRAMMAR_CHARS = 65_536  # a custom tool's grammar definition
MAX_NAMESPACE_DESCRIPTION_CHARS = 8_192
MAX_SEALED_CHARS = 262_144  # a compaction item's encrypted_content (its summary is at most 4096 tokens)
MAX_HISTORY_MESSAGES = 8192  # a previous_response_id chain is flattened into one stored conversation
MAX_STREAM_BACKLOG = 8192  # unread SSE events kept per stream; past it the stream waits (Chat) or is cut (Responses)
