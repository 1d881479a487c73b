"""The Conversations API: conversations and their items, the history `conversation` on a response extends."""
