"""OpenAI request bodies → engine inputs: field mapping onto SamplingParams (defaults left to it),
chat's logprobs/max_completion_tokens rules, unknown fields ignored, unsupported ones refused."""

import logging

import pytest
from pydantic import ValidationError

from pdserve.engine.errors import RequestError
from pdserve.engine.generation_config import GenerationDefaults
from pdserve.engine.sampling_params import SamplingParams
from pdserve.engine.tokenizer import Tokenizer
from pdserve.router.api.engine_inputs import chat_prompt, completion_budget, sampling_params
from pdserve.router.api.errors import APIError
from pdserve.router.api.openai_requests import ChatCompletionRequest, CompletionRequest

MESSAGES = [{"role": "user", "content": "hi"}]
TOOL_CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def test_unset_and_null_fields_take_the_engine_defaults() -> None:
    request = CompletionRequest(prompt="x", temperature=None, top_p=None)
    assert request.sampling_kwargs() == {}
    assert request.max_tokens == 16  # OpenAI's default for /v1/completions
    params = sampling_params(max_tokens=request.max_tokens, **request.sampling_kwargs())
    assert params == SamplingParams(max_tokens=16)


def test_given_fields_reach_sampling_params_under_their_names() -> None:
    body = {
        "n": 2,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 5,
        "min_p": 0.1,
        "presence_penalty": 0.5,
        "frequency_penalty": -0.5,
        "repetition_penalty": 1.1,
        "seed": 3,
        "stop": "x",
        "stop_token_ids": [7],
        "ignore_eos": True,
        "min_tokens": 2,
        "skip_special_tokens": False,
        "include_stop_str_in_output": True,
    }
    request = CompletionRequest(prompt="x", user="u", priority=-1, **body)
    params = sampling_params(max_tokens=4, logprobs=1, **request.sampling_kwargs())
    assert params == SamplingParams(max_tokens=4, logprobs=1, **{**body, "stop": ("x",)})
    assert request.priority == -1


@pytest.mark.parametrize(
    ("prompt", "prompts"),
    [
        ("a", ["a"]),
        (["a", "b"], ["a", "b"]),
        ([1, 2], [[1, 2]]),
        ([[1], [2, 3]], [[1], [2, 3]]),
    ],
)
def test_every_prompt_shape_becomes_a_list_of_prompts(prompt: object, prompts: object) -> None:
    assert CompletionRequest(prompt=prompt).prompts == prompts


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": ""},
        {"prompt": []},
        {"prompt": "x", "echo": True, "logprobs": 1},
        {"prompt": "x", "stream_options": {"include_usage": True}},
        {"prompt": "x", "logit_bias": {"1": 5}},
        {"prompt": "x", "suffix": "end"},
        {"prompt": "x", "best_of": 2},
        {"prompt": "x", "response_format": {"type": "json_object"}},
        {"prompt": "x", "max_tokens": "lots"},
    ],
)
def test_invalid_completion_bodies_are_refused(body: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        CompletionRequest(**body)


def test_unknown_fields_are_ignored_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        # Unsupported fields at their "not used" values are accepted silently.
        unused = {"logit_bias": {}, "best_of": 1, "response_format": {"type": "text"}}
        request = CompletionRequest(prompt="x", shiny_new_field=1, **unused)
    assert request.sampling_kwargs() == {}
    assert "shiny_new_field" in caplog.text
    assert not any(name in caplog.text for name in ("logit_bias", "best_of", "response_format"))


def test_chat_logprobs_and_token_limits() -> None:
    assert ChatCompletionRequest(messages=MESSAGES).num_logprobs is None
    assert ChatCompletionRequest(messages=MESSAGES, logprobs=True).num_logprobs == 0
    request = ChatCompletionRequest(messages=MESSAGES, logprobs=True, top_logprobs=3)
    assert request.num_logprobs == 3
    with pytest.raises(ValidationError, match="top_logprobs requires logprobs"):
        ChatCompletionRequest(messages=MESSAGES, top_logprobs=3)
    assert ChatCompletionRequest(messages=MESSAGES).requested_max_tokens is None
    assert ChatCompletionRequest(messages=MESSAGES, max_tokens=5).requested_max_tokens == 5
    both = ChatCompletionRequest(messages=MESSAGES, max_tokens=5, max_completion_tokens=7)
    assert both.requested_max_tokens == 7


def test_chat_messages_reach_the_template_as_sent() -> None:
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}], "name": "ann"},
        {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
    ]
    assert ChatCompletionRequest(messages=messages).chat() == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}], "name": "ann"},
        {"role": "assistant", "tool_calls": [TOOL_CALL]},
    ]
    with pytest.raises(ValidationError, match="only text content parts"):
        ChatCompletionRequest(messages=[{"role": "user", "content": [{"type": "image_url"}]}])
    with pytest.raises(ValidationError):
        ChatCompletionRequest(messages=[])


def test_out_of_range_values_raise_request_error_naming_the_field() -> None:
    with pytest.raises(RequestError) as error:
        sampling_params(max_tokens=4, top_p=2.0)
    assert error.value.param == "top_p" and "top_p must be" in str(error.value)


@pytest.mark.parametrize(
    ("requested", "prompt_lens", "expected"),
    [(None, [10], 90), (None, [10, 40], 60), (90, [10], 90), (-1, [10], -1)],
)
def test_completion_budget_defaults_to_the_rest_of_the_context(
    requested: int | None, prompt_lens: list[int], expected: int
) -> None:
    assert (
        completion_budget(requested, prompt_lens, 100, "prompt", GenerationDefaults()) == expected
    )


@pytest.mark.parametrize(("requested", "prompt_lens"), [(91, [10]), (None, [100]), (None, [150])])
def test_completion_budget_refuses_what_does_not_fit(
    requested: int | None, prompt_lens: list[int]
) -> None:
    with pytest.raises(APIError, match="maximum context length is 100 tokens") as error:
        completion_budget(requested, prompt_lens, 100, "messages", GenerationDefaults())
    assert (error.value.param, error.value.code) == ("messages", "context_length_exceeded")


@pytest.mark.parametrize("kwargs", [{"messages": []}, {"tokenize": False}])
def test_template_kwargs_may_not_set_the_templates_own_arguments(kwargs: dict) -> None:
    with pytest.raises(ValidationError, match="chat_template_kwargs"):
        ChatCompletionRequest(messages=MESSAGES, chat_template_kwargs=kwargs)


def test_template_kwargs_the_renderer_cannot_take_are_a_request_error(tiny_model_dir) -> None:
    request = ChatCompletionRequest(messages=MESSAGES, chat_template_kwargs={"self": 1})
    with pytest.raises(RequestError, match="chat template") as error:
        chat_prompt(request, Tokenizer.from_pretrained(tiny_model_dir))
    assert error.value.param == "messages"
