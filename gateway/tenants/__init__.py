"""Who a request is for and what it may do: API keys, tenants, per-tenant limits and admission."""
