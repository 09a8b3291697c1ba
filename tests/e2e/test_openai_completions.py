"""/v1/completions through the real ``openai`` SDK: greedy tokens equal the offline engine's,
streamed or not; usage (cached tokens too), n, logprobs, echo and stop strings."""

import openai
import pytest

from pdserve.engine.llm import LLM
from pdserve.engine.outputs import RequestOutput
from pdserve.engine.sampling_params import SamplingParams

MODEL = "tiny"
PROMPT = "Hello, my name is"
MAX_TOKENS = 8
# Greedy, a fixed length, and the generated token ids in the logprobs ("token_id:<id>").
GREEDY = {"temperature": 0, "max_tokens": MAX_TOKENS, "logprobs": 0}
GREEDY_EXTRA = {"ignore_eos": True, "return_tokens_as_token_ids": True}
BLOCK_SIZE = 16  # the engine's default


@pytest.fixture(scope="module")
def reference(offline: LLM) -> RequestOutput:
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    return offline.generate(PROMPT, params)[0]


def _ids(tokens: list[str]) -> list[int]:
    return [int(token.removeprefix("token_id:")) for token in tokens]


def test_greedy_completion_equals_offline(client: openai.OpenAI, reference: RequestOutput) -> None:
    response = client.completions.create(
        model=MODEL, prompt=PROMPT, extra_body=GREEDY_EXTRA, **GREEDY
    )
    (choice,) = response.choices
    assert _ids(choice.logprobs.tokens) == reference.token_ids
    assert choice.text == reference.text
    assert choice.finish_reason == "length"
    assert response.model == MODEL and response.object == "text_completion"
    usage = response.usage
    assert usage.prompt_tokens == len(reference.prompt_token_ids)
    assert usage.completion_tokens == MAX_TOKENS
    assert usage.total_tokens == usage.prompt_tokens + MAX_TOKENS


def test_streamed_completion_equals_offline(
    client: openai.OpenAI, reference: RequestOutput
) -> None:
    stream = client.completions.create(
        model=MODEL,
        prompt=PROMPT,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=GREEDY_EXTRA,
        **GREEDY,
    )
    chunks = list(stream)
    *deltas, last = chunks
    assert last.choices == [] and last.usage.completion_tokens == MAX_TOKENS
    assert all(chunk.usage is None for chunk in deltas)
    assert "".join(chunk.choices[0].text for chunk in deltas) == reference.text
    tokens = [t for chunk in deltas for t in chunk.choices[0].logprobs.tokens]
    assert _ids(tokens) == reference.token_ids
    assert [chunk.choices[0].finish_reason for chunk in deltas][-1] == "length"
    assert {chunk.id for chunk in chunks} == {chunks[0].id}


def test_token_id_prompt_equals_text_prompt(
    client: openai.OpenAI, reference: RequestOutput
) -> None:
    response = client.completions.create(
        model=MODEL, prompt=reference.prompt_token_ids, extra_body=GREEDY_EXTRA, **GREEDY
    )
    assert _ids(response.choices[0].logprobs.tokens) == reference.token_ids


def test_repeated_prompt_reports_cached_tokens(client: openai.OpenAI) -> None:
    # A prompt no other test sends, over two full blocks; the last prompt token is never cached.
    prompt = " ".join(f"cache{i}" for i in range(24))
    first, second = (
        client.completions.create(model=MODEL, prompt=prompt, max_tokens=1) for _ in range(2)
    )
    num_prompt = first.usage.prompt_tokens
    assert num_prompt > 2 * BLOCK_SIZE
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    expected = (num_prompt - 1) // BLOCK_SIZE * BLOCK_SIZE
    assert second.usage.prompt_tokens_details.cached_tokens == expected


def test_n_and_several_prompts_give_one_choice_each(client: openai.OpenAI) -> None:
    response = client.completions.create(
        model=MODEL, prompt=["a", "b c"], n=2, max_tokens=3, seed=7, extra_body={"ignore_eos": True}
    )
    assert sorted(choice.index for choice in response.choices) == [0, 1, 2, 3]
    assert response.usage.completion_tokens == 4 * 3
    # Each prompt is counted once however many completions it has, as OpenAI counts.
    prompt_tokens = sum(
        client.completions.create(model=MODEL, prompt=p, max_tokens=1).usage.prompt_tokens
        for p in ("a", "b c")
    )
    assert response.usage.prompt_tokens == prompt_tokens


def test_streamed_n_interleaves_choices_that_all_finish(client: openai.OpenAI) -> None:
    stream = client.completions.create(
        model=MODEL, prompt=PROMPT, n=2, max_tokens=4, stream=True, extra_body={"ignore_eos": True}
    )
    finished = {c.index: c.finish_reason for chunk in stream for c in chunk.choices}
    assert finished == {0: "length", 1: "length"}


def test_logprobs_list_the_top_tokens(client: openai.OpenAI) -> None:
    response = client.completions.create(
        model=MODEL, prompt=PROMPT, temperature=0, max_tokens=4, logprobs=3
    )
    logprobs = response.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == 4
    assert logprobs.text_offset[0] == 0
    for token, logprob, top in zip(
        logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True
    ):
        assert len(top) >= 3 and logprob <= 0
        # Greedy: the sampled token is the most likely one.
        assert top[token] == logprob == max(top.values())


def test_echo_prepends_the_prompt(client: openai.OpenAI, reference: RequestOutput) -> None:
    body = {"model": MODEL, "prompt": PROMPT, "temperature": 0, "max_tokens": MAX_TOKENS}
    response = client.completions.create(echo=True, extra_body={"ignore_eos": True}, **body)
    assert response.choices[0].text == PROMPT + reference.text
    stream = client.completions.create(
        echo=True, stream=True, extra_body={"ignore_eos": True}, **body
    )
    assert "".join(chunk.choices[0].text for chunk in stream) == PROMPT + reference.text


def test_stop_string_ends_the_text_before_it(
    client: openai.OpenAI, reference: RequestOutput
) -> None:
    stop = reference.text[len(reference.text) // 2 :][:3]
    response = client.completions.create(
        model=MODEL, prompt=PROMPT, temperature=0, max_tokens=MAX_TOKENS, stop=[stop]
    )
    (choice,) = response.choices
    assert choice.text == reference.text[: reference.text.find(stop)]
    assert choice.finish_reason == "stop"
    assert choice.model_extra["stop_reason"] == stop
