"""Choosing the model server for each generation: by the prefix it holds and its load."""
