"""The bodies of ``POST /v1/completions`` and ``/v1/chat/completions``, as vLLM's server reads them.

Fields are OpenAI's plus vLLM's sampling extras that our engine implements. A field left out (or
sent as null) takes ``SamplingParams``' default, so defaults live in one place. Unknown fields are
ignored with a warning, as vLLM does, so clients that send newer OpenAI fields keep working; the
OpenAI fields that would change the output but that the engine cannot honour (``UNSUPPORTED``)
are refused instead, since silently ignoring them would return something else than was asked.
"""

import logging
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

logger = logging.getLogger(__name__)

# OpenAI's default `max_tokens` for /v1/completions; chat defaults to the rest of the context.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
# OpenAI fields that would change the output but that the engine cannot honour, with the values
# that mean "not used" (which some clients send by default).
UNSUPPORTED = {
    "best_of": (None, 1),
    "functions": (None, []),
    "logit_bias": (None, {}),
    "response_format": (None, {"type": "text"}),
    "suffix": (None, ""),
    "tools": (None, []),
}
# Request fields passed to SamplingParams under the same name.
SAMPLING_FIELDS = (
    "n",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "min_tokens",
    "skip_special_tokens",
    "include_stop_str_in_output",
)


class StreamOptions(BaseModel):
    include_usage: bool = False


class OpenAIRequest(BaseModel):
    """The fields both endpoints share."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None  # None: the first served model, as in vLLM
    n: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool | None = None
    min_tokens: int | None = None
    skip_special_tokens: bool | None = None
    include_stop_str_in_output: bool | None = None
    user: str | None = None
    priority: int = 0  # lower runs first under the engine's "priority" policy
    stream: bool = False
    stream_options: StreamOptions | None = None
    # vLLM's: logprob tokens as "token_id:<id>" instead of text, for clients that need the ids.
    return_tokens_as_token_ids: bool = False

    @model_validator(mode="after")
    def _check_extra_fields(self) -> "OpenAIRequest":
        extra = self.model_extra or {}
        refused = sorted(k for k, unused in UNSUPPORTED.items() if extra.get(k) not in unused)
        if refused:
            raise ValueError(f"not supported by this server: {', '.join(refused)}")
        ignored = sorted(k for k in extra if k not in UNSUPPORTED)
        if ignored:
            logger.warning("ignoring unknown request fields: %s", ", ".join(ignored))
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options can only be set when stream is true")
        return self

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def sampling_kwargs(self) -> dict[str, Any]:
        """The ``SamplingParams`` fields the client gave (besides max_tokens and logprobs)."""
        given = {name: getattr(self, name) for name in SAMPLING_FIELDS}
        return {name: value for name, value in given.items() if value is not None}


class CompletionRequest(OpenAIRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = COMPLETIONS_DEFAULT_MAX_TOKENS  # None: the rest of the context
    logprobs: int | None = None  # how many top logprobs per token, besides the sampled one
    echo: bool = False

    @field_validator("prompt")
    @classmethod
    def _check_prompt(cls, prompt: str | list) -> str | list:
        if not prompt:
            raise ValueError("must not be empty")
        return prompt

    @model_validator(mode="after")
    def _check_echo(self) -> "CompletionRequest":
        if self.echo and self.logprobs is not None:
            # The engine computes no prompt logprobs, which echo would have to return.
            raise ValueError("echo together with logprobs is not supported")
        return self

    @property
    def prompts(self) -> list[str | list[int]]:
        """One entry per prompt: text, or token ids."""
        prompt = self.prompt
        if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
            return [prompt]
        return list(prompt)


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    # Extra keys (name, tool_calls, ...) are passed on to the chat template.
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[TextPart] | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_only(cls, content: Any) -> Any:
        # Checked first, so the error names the field rather than each member of its union type.
        if isinstance(content, list) and any(
            not isinstance(part, dict) or part.get("type") != "text" for part in content
        ):
            raise ValueError("only text content parts are supported")
        return content


class ChatCompletionRequest(OpenAIRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None  # deprecated by OpenAI in favour of max_completion_tokens
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _check_logprobs(self) -> "ChatCompletionRequest":
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs to be true")
        return self

    @property
    def requested_max_tokens(self) -> int | None:
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens

    @property
    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def chat(self) -> list[dict[str, Any]]:
        """The messages as the chat template reads them."""
        return [message.model_dump(exclude_none=True) for message in self.messages]
