"""Constrained decoding: the backend Constraint as an llguidance grammar over Harmony output, applied as
a token bitmask at every step (the sampler masks the logits with it).

The grammar covers what follows the prompt's `<|start|>assistant`: at most one analysis message, then the
answer the constraint allows: a function call (`<|channel|>commentary to=functions.NAME <|constrain|>json
<|message|>ARGS<|call|>`, ARGS valid against the function's parameters; `to=NS.NAME` in a client
namespace), a freeform tool's call (`<|channel|>commentary to=functions.NAME<|message|>INPUT<|call|>`,
INPUT held to the tool's own Lark or regex grammar, included as a sub-grammar), a built-in tool's call
(`<|channel|>analysis to=python code<|message|>CODE<|call|>`; the browser's with a JSON object) and/or a final message
(JSON valid against the text format's schema when there is one). The analysis may take at most half of the request's
token budget, so that the constrained answer always has room to come out.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any

import llguidance
import numpy as np

from backends.base import BackendError, Constraint
from harmony import HarmonyEncoding
from harmony.tokens import RETURN, SPECIAL_TOKENS

ANY_OBJECT: dict[str, Any] = {"type": "object"}
# compact JSON as the model writes it; llguidance's default would let whitespace run on without bound
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _json(schema: dict[str, Any]) -> str:
    return "%json " + json.dumps({**schema, "x-guidance": JSON_LAYOUT})


def _string(text: str) -> str:
    return json.dumps(text)  # a lark string literal: JSON escaping is a subset of what lark accepts


def _recipient(name: str) -> str:
    """A constraint's tool name as the model addresses it (function names have no dot; `ns.name` has one)."""
    return name if "." in name else f"functions.{name}"


def input_grammar(syntax: str, definition: str) -> str:
    """A freeform tool's input grammar as Lark text ("" syntax: any text)."""
    if syntax == "lark":
        return definition
    if syntax == "regex":
        return json.loads(llguidance.LLMatcher.grammar_from_regex(definition))["grammars"][0]["lark_grammar"]
    return "start: /(.|\\n)*/"


def harmony_grammar(
    constraint: Constraint, reasoning_tokens: int, parameters: dict[str, dict[str, Any]] | None = None
) -> str:
    """The lark grammar of a generation that keeps `constraint`; `parameters` overrides the argument schemas.
    A freeform tool's input is `@input_N`, the sub-grammar `top_level_grammar` adds under that name."""
    if parameters is None:
        parameters = {name: schema or ANY_OBJECT for name, schema in constraint.tool_parameters.items()}
    freeform = list(constraint.tool_grammars)
    builtin = constraint.builtin_calls
    callable_names = constraint.tool_names if constraint.tools == "required" else (*parameters, *freeform, *builtin)
    answers = []
    rules = []
    if constraint.tools != "none":
        for index, name in enumerate(callable_names):
            if name in builtin:
                header, schema = builtin[name]
                body = f"args_{index}" if schema is not None else "text"
                rules.append(f"call_{index}: <|channel|> {_string(header)} <|message|> {body} <|call|>")
                if schema is not None:
                    rules.append(f"args_{index}: {_json(schema)}")
            elif name in constraint.tool_grammars:
                header = _string(f"commentary to={_recipient(name)}")
                rules.append(f"call_{index}: <|channel|> {header} <|message|> @input_{freeform.index(name)} <|call|>")
            else:
                header = _string(f"commentary to={_recipient(name)} ")
                rules.append(
                    f'call_{index}: <|channel|> {header} <|constrain|> "json" <|message|> args_{index} <|call|>'
                )
                rules.append(f"args_{index}: {_json(parameters.get(name) or ANY_OBJECT)}")
            answers.append(f"call_{index}")
    if constraint.tools != "required":
        schema = constraint.final_json_schema
        body = "text" if schema is None else "answer_json"
        rules.append(f'final: <|channel|> "final" <|message|> {body} <|return|>')
        if schema is not None:
            rules.append(f"answer_json: {_json(schema)}")
        answers.append("final")
    if not answers:
        raise BackendError("tool_choice requires a tool call, and no tools were offered.")
    analysis = (
        f'analysis: <|channel|> "analysis" <|message|> reasoning <|end|> <|start|> "assistant"\n'
        f"reasoning[max_tokens={reasoning_tokens}]: /(.|\\n)*/\n"
        if reasoning_tokens > 0
        else ""
    )
    start = ("start: analysis? answer\n" if analysis else "start: answer\n") + f"answer: {' | '.join(answers)}\n"
    return start + analysis + "text: /(.|\\n)*/\n" + "\n".join(rules) + "\n"


def top_level_grammar(constraint: Constraint, main: str) -> str:
    """llguidance's grammar list: the Harmony grammar first, then each freeform tool's input grammar."""
    grammars = [{"name": "main", "lark_grammar": main}]
    for index, (syntax, definition) in enumerate(constraint.tool_grammars.values()):
        grammars.append({"name": f"input_{index}", "lark_grammar": input_grammar(syntax, definition)})
    return json.dumps({"grammars": grammars})


# Compiled grammars kept, by tenant and grammar text: a generation takes a copy of its grammar's pristine matcher
# (microseconds) instead of compiling it again (3.2 ms for a JSON-schema answer at the real vocabulary, on an AMD
# EPYC core). Per tenant, so that how soon a generation starts says nothing of another tenant's schemas; grammars
# longer than KEPT_GRAMMAR_CHARS are compiled each time (a large schema's matcher is not kept in memory).
KEPT_GRAMMARS = 256
KEPT_GRAMMAR_CHARS = 65_536


class GrammarCompiler:
    """The engine's tokenizer for llguidance (built once: about a second) and per-request matchers, copied from
    the tenant's compiled grammars when the same grammar was compiled before."""

    def __init__(self, encoding: HarmonyEncoding, vocab_size: int) -> None:
        specials = {text: token for text, token in SPECIAL_TOKENS.items() if token < vocab_size}
        self.vocab_size = vocab_size
        self._tokenizer = llguidance.LLTokenizer.from_tiktoken(
            encoder=encoding.mergeable_ranks,
            special_tokens=specials,
            pattern=encoding.pattern,
            eos_token=RETURN,
            n_vocab=vocab_size,
        )
        self._kept: OrderedDict[tuple[str, str], llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()  # generations start on several executor threads

    def guide(self, constraint: Constraint, max_new_tokens: int, tenant: str = "") -> TokenGuide:
        """A matcher for one generation of `tenant`'s; BackendError when the constraint cannot be compiled."""
        reasoning = max_new_tokens // 2
        matcher = self._matcher(tenant, constraint, harmony_grammar(constraint, reasoning))
        if matcher.is_error() and constraint.tool_parameters:
            # a parameters schema llguidance cannot compile: the arguments are still held to a JSON object
            loose = {name: ANY_OBJECT for name in constraint.tool_parameters}
            matcher = self._matcher(tenant, constraint, harmony_grammar(constraint, reasoning, loose))
        if matcher.is_error():
            raise BackendError(f"The output constraint cannot be enforced by this engine: {matcher.get_error()}")
        return TokenGuide(matcher, self.vocab_size)

    def _matcher(self, tenant: str, constraint: Constraint, lark: str) -> llguidance.LLMatcher:
        """A fresh matcher of the grammar: a copy of the tenant's kept one, or compiled (and kept when small)."""
        grammar = top_level_grammar(constraint, lark)
        key = (tenant, grammar)
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None:
                self._kept.move_to_end(key)
                return kept.deep_copy()
        matcher = llguidance.LLMatcher(self._tokenizer, grammar, log_level=0)
        if matcher.is_error() or len(grammar) > KEPT_GRAMMAR_CHARS:
            return matcher
        with self._lock:
            self._kept[key] = matcher
            while len(self._kept) > KEPT_GRAMMARS:
                self._kept.popitem(last=False)
            return matcher.deep_copy()  # the kept one stays at the grammar's start


class TokenGuide:
    """One generation's grammar state: the tokens allowed before sampling, then the sampled token taken."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int) -> None:
        self._matcher = matcher
        self._vocab_size = vocab_size
        self._bits = np.zeros((vocab_size + 31) // 32, dtype=np.uint32)

    def allowed(self) -> np.ndarray:
        """The tokens the grammar allows here: bit i of word i // 32 (uint32 words; the next call reuses them)."""
        self._matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        return self._bits

    def accept(self, token: int) -> None:
        if not self._matcher.consume_token(token):
            raise RuntimeError(f"the grammar rejected token {token}: {self._matcher.get_error()}")
