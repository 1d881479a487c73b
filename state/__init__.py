"""Response and chain-of-thought state: in-memory and Redis stores."""
