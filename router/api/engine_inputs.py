"""From an API request to the engine's inputs: prompt token ids, a completion budget that fits
the model, and sampling params (the model's generation defaults for the fields the request left
out: ``engine/generation_config.py``); bad input raises ``RequestError`` naming the field."""

from typing import Any

import jinja2

from pdserve.engine.errors import RequestError
from pdserve.engine.generation_config import GenerationDefaults
from pdserve.engine.sampling_params import SamplingParams
from pdserve.engine.tokenizer import Tokenizer
from pdserve.router.api.errors import context_length_error
from pdserve.router.api.openai_requests import ChatCompletionRequest, CompletionRequest


def completion_prompts(request: CompletionRequest, tokenizer: Tokenizer) -> list[list[int]]:
    # Text is encoded as the offline engine encodes it (with the tokenizer's special tokens).
    return [p if isinstance(p, list) else tokenizer.encode(p) for p in request.prompts]


def chat_prompt(request: ChatCompletionRequest, tokenizer: Tokenizer) -> list[int]:
    try:
        return tokenizer.apply_chat_template(
            request.chat(),
            add_generation_prompt=request.add_generation_prompt,
            tokenize=True,
            **(request.chat_template_kwargs or {}),
        )
    # No template, the template refused, or chat_template_kwargs it cannot take (a TypeError: an
    # argument the renderer itself has, or a value of a type the template cannot use).
    except (ValueError, TypeError, jinja2.TemplateError) as error:
        raise RequestError(f"cannot apply the chat template: {error}", "messages") from error


def completion_budget(
    requested: int | None,
    prompt_lens: list[int],
    max_model_len: int,
    prompt_field: str,
    defaults: GenerationDefaults,
) -> int:
    """``max_tokens`` as requested, else the model's default within what the context leaves,
    else all of that, and at most the defaults' cap; refuses a prompt plus requested completion
    that does not fit (vLLM refuses it rather than cutting it short). ``prompt_field`` names the
    prompt's request field in the error."""
    longest = max(prompt_lens)
    left = max_model_len - longest
    if requested is not None:
        max_tokens = requested
    else:
        max_tokens = left if defaults.max_tokens is None else min(defaults.max_tokens, left)
    # A max_tokens < 1 is left to SamplingParams' own message; it fits whenever the prompt does.
    if longest + max(max_tokens, 1) > max_model_len:
        raise context_length_error(max_model_len, longest, max(max_tokens, 1), prompt_field)
    cap = defaults.max_tokens_cap
    return max_tokens if cap is None else min(max_tokens, cap)


def sampling_params(**kwargs: Any) -> SamplingParams:
    try:
        return SamplingParams(**kwargs)
    except ValueError as error:  # SamplingParams' messages start with the field's name
        raise RequestError(str(error), str(error).split(" ", 1)[0]) from error
