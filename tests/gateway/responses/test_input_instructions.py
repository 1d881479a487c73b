"""System and developer messages of a request's input are part of its conversation: a `previous_response_id`
chain keeps them for its later turns (the `instructions` parameter, as OpenAI has it, is not carried), and the
prompt a chain renders is the one a stateless client re-sending everything renders."""

from __future__ import annotations

import openai
import pytest

MODEL = "gpt-oss-120b"
RULE = "Always answer in French."


@pytest.mark.parametrize("role", ["developer", "system"])
def test_a_chain_keeps_the_input_s_developer_messages(gateway, role):
    api = openai.OpenAI(base_url=gateway.url + "/v1", api_key="sk-tenant-a", max_retries=0)
    opening = [{"role": role, "content": RULE}, {"role": "user", "content": "thanks"}]
    first = api.responses.create(model=MODEL, input=opening, instructions="Be brief.")
    chained = api.responses.create(model=MODEL, input="thanks", previous_response_id=first.id)
    chain_prompt = gateway.backend.prompt_text()
    developer = chain_prompt.split("<|start|>developer<|message|>", 1)[1].split("<|end|>", 1)[0]
    assert RULE in developer and "Be brief." not in developer  # the message stays; the parameter does not
    replayed = [
        *opening,
        *(item.model_dump(exclude_none=True) for item in first.output),
        {"role": "user", "content": "thanks"},
    ]
    api.responses.create(model=MODEL, input=replayed)
    assert gateway.backend.prompt_text() == chain_prompt  # stateless re-send, same prompt
    assert chained.output_text == "You are welcome."
