"""The Responses API: routes, request models, input and output mapping, and the runs behind them."""
