"""The Chat Completions API: routes, request models, input and output mapping, stop sequences."""
