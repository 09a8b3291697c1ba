"""/v1/chat/completions through the real ``openai`` SDK: the model's chat template, greedy tokens
equal to the offline engine's on the templated prompt, streamed or not; n; logprobs."""

import openai
import pytest

from pdserve.engine.llm import LLM
from pdserve.engine.outputs import RequestOutput
from pdserve.engine.sampling_params import SamplingParams

MODEL = "tiny"
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": [{"type": "text", "text": "Name a colour."}]},
]
MAX_TOKENS = 8
GREEDY = {"temperature": 0, "max_completion_tokens": MAX_TOKENS}
GREEDY_EXTRA = {"ignore_eos": True}


@pytest.fixture(scope="module")
def reference(offline: LLM) -> RequestOutput:
    prompt = offline.get_tokenizer().apply_chat_template(MESSAGES, tokenize=True)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    return offline.generate(prompt, params)[0]


def test_greedy_chat_equals_offline_on_the_templated_prompt(
    client: openai.OpenAI, reference: RequestOutput
) -> None:
    response = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        logprobs=True,
        extra_body={**GREEDY_EXTRA, "return_tokens_as_token_ids": True},
        **GREEDY,
    )
    (choice,) = response.choices
    assert choice.message.role == "assistant"
    assert choice.message.content == reference.text
    ids = [int(lp.token.removeprefix("token_id:")) for lp in choice.logprobs.content]
    assert ids == reference.token_ids
    assert choice.finish_reason == "length"
    assert response.object == "chat.completion"
    assert response.usage.prompt_tokens == len(reference.prompt_token_ids)
    assert response.usage.completion_tokens == MAX_TOKENS


def test_streamed_chat_equals_offline(client: openai.OpenAI, reference: RequestOutput) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=GREEDY_EXTRA,
        **GREEDY,
    )
    first, *deltas, last = list(stream)
    assert first.choices[0].delta.role == "assistant" and first.choices[0].delta.content == ""
    assert "".join(chunk.choices[0].delta.content for chunk in deltas) == reference.text
    assert deltas[-1].choices[0].finish_reason == "length"
    assert last.choices == []
    assert last.usage.prompt_tokens == len(reference.prompt_token_ids)
    assert last.usage.completion_tokens == MAX_TOKENS


def test_max_tokens_is_read_when_max_completion_tokens_is_absent(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=3, extra_body=GREEDY_EXTRA
    )
    assert response.usage.completion_tokens == 3


def test_n_choices_with_top_logprobs(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        n=2,
        max_completion_tokens=3,
        logprobs=True,
        top_logprobs=2,
        seed=3,
        extra_body=GREEDY_EXTRA,
    )
    assert [choice.index for choice in response.choices] == [0, 1]
    assert response.usage.completion_tokens == 2 * 3
    for choice in response.choices:
        assert len(choice.logprobs.content) == 3
        for position in choice.logprobs.content:
            assert len(position.top_logprobs) == 2
            top = [lp.logprob for lp in position.top_logprobs]
            assert top == sorted(top, reverse=True) and position.logprob <= 0
            assert position.bytes == list(position.token.encode())
