"""OpenAI's reference Responses server (the `gpt-oss` package) with an instant backend, for
bench/gateway_bench.py. Run it with a Python 3.12 that has `gpt-oss` installed:

    python3.12 bench/reference_server.py --port 8000 --tokens tokens.json

`tokens.json` holds the completion token ids every request receives (the same Harmony output the
gateway's mock emits). The package's own `stub` backend sleeps 100 ms per token, so this wraps the
server's `create_api_server` with a backend that answers at once, keeping the rest of it as shipped.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable


def instant_backend(completion: list[int]) -> Callable[..., int]:
    """The server's `infer_next_token`: the next token of `completion` for the sequence it extends."""
    cursors: dict[int, int] = {}  # id of a request's token list -> tokens emitted into it

    def infer_next_token(tokens: list[int], temperature: float = 0.0, new_request: bool = False) -> int:
        key = id(tokens)
        position = 0 if new_request else cursors.get(key, 0)
        cursors[key] = position + 1
        if position + 1 == len(completion):
            cursors.pop(key)
        return completion[position % len(completion)]

    return infer_next_token


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tokens", required=True, help="JSON list of completion token ids")
    args = parser.parse_args()

    import uvicorn
    from gpt_oss.responses_api.api_server import create_api_server
    from openai_harmony import HarmonyEncodingName, load_harmony_encoding

    with open(args.tokens) as f:
        completion = json.load(f)
    encoding = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    app = create_api_server(instant_backend(completion), encoding)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
