"""The usage ledger's side of the gateway: billing each finished answer, and reading the ledger back."""
