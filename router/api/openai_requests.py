"""The bodies of ``POST /v1/completions`` and ``/v1/chat/completions``, as vLLM's server reads them.

Fields are OpenAI's plus vLLM's sampling extras that our engine implements. A field left out (or
sent as null) takes the served model's generation default (``engine/generation_config.py``), else
``SamplingParams``' default, so defaults live in one place. Unknown fields are ignored with a
warning, as vLLM does, so clients that send newer OpenAI fields keep working; the OpenAI fields
that would change the output but that the engine cannot honour (``UNSUPPORTED``) are refused
instead, since silently ignoring them would return something else than was asked.

Types are strict, as OpenAI's (``"n": "2"`` or ``"echo": 0`` is a 400), and each field's range
and each rule between fields (JSON Schema's ``if``/``then``) is in the OpenAPI document too, so a
body the document allows is one the server takes, and one it forbids is refused.
"""

import logging
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from pdserve.engine.sampling_params import (
    MAX_ABS_ADDITIVE_PENALTY,
    MAX_LOGPROBS,
    MAX_N,
    SEED_MAX,
    SEED_MIN,
    SamplingParams,
)
from pdserve.router.api.chat_messages import ChatMessage

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
# What the chat template is rendered with besides chat_template_kwargs, which may not set them.
TEMPLATE_ARGUMENTS = ("messages", "add_generation_prompt", "tokenize")


def _whole(value: Any) -> Any:
    # JSON Schema counts 2.0 as an integer (and Python's JSON reads it as a float); strict types
    # would refuse it.
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _int(**bounds: int) -> Any:
    """An integer type within ``bounds`` (``Field``'s ``ge``, ``le``); bounds first, so that the
    document shows them."""
    return Annotated[int, Field(**bounds), BeforeValidator(_whole)]


TokenId = _int(ge=0)
Text = Annotated[str, Field(min_length=1)]
TokenIds = Annotated[list[TokenId], Field(min_length=1)]
Penalty = Annotated[float, Field(ge=-MAX_ABS_ADDITIVE_PENALTY, le=MAX_ABS_ADDITIVE_PENALTY)]
Logprobs = _int(ge=0, le=MAX_LOGPROBS)
MaxTokens = _int(ge=1)


def _model_default(field: str) -> str:
    """The documented default of a field the model's generation_config.json may set."""
    otherwise = SamplingParams.__dataclass_fields__[field].default
    return f"default: the model's generation_config.json, else {otherwise}"


# What max_tokens left out (or null) means; as in vLLM, a max_new_tokens the server was started
# with caps any max_tokens (engine/generation_config.py).
MAX_TOKENS_DEFAULT = (
    "the model's generation_config.json (max_new_tokens), else the rest of the context; any value "
    "at most a max_new_tokens the server was started with"
)


def _set(field: str, json_type: str) -> dict[str, Any]:
    return {"required": [field], "properties": {field: {"type": json_type}}}


def _is(field: str, value: Any) -> dict[str, Any]:
    return {"required": [field], "properties": {field: {"const": value}}}


def _rules(*rules: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    """A model's ``json_schema_extra``: the rules its validators check that no field's own
    schema can state."""

    def extra(schema: dict[str, Any]) -> None:
        schema["allOf"] = list(rules)

    return extra


SHARED_RULES = (
    {"if": _set("stream_options", "object"), "then": _is("stream", True)},
    {"properties": {field: {"enum": list(unused)} for field, unused in UNSUPPORTED.items()}},
)
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
    model_config = ConfigDict(strict=True)

    include_usage: bool = False


class OpenAIRequest(BaseModel):
    """The fields both endpoints share."""

    model_config = ConfigDict(extra="allow", strict=True, json_schema_extra=_rules(*SHARED_RULES))

    model: str | None = None  # None: the first served model, as in vLLM
    n: _int(ge=1, le=MAX_N) | None = None
    temperature: float | None = Field(None, ge=0, description=_model_default("temperature"))
    top_p: float | None = Field(None, gt=0, le=1, description=_model_default("top_p"))
    # 0 or -1: disabled
    top_k: _int(ge=-1) | None = Field(None, description=_model_default("top_k"))
    min_p: float | None = Field(None, ge=0, le=1, description=_model_default("min_p"))
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: float | None = Field(
        None, gt=0, description=_model_default("repetition_penalty")
    )
    seed: _int(ge=SEED_MIN, le=SEED_MAX) | None = None
    stop: Text | list[Text] | None = None
    stop_token_ids: list[TokenId] | None = None
    ignore_eos: bool | None = None
    min_tokens: _int(ge=0) | None = None  # and at most max_tokens
    skip_special_tokens: bool | None = None
    include_stop_str_in_output: bool | None = None
    user: str | None = None
    priority: _int() = 0  # lower runs first under the engine's "priority" policy
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
    model_config = ConfigDict(
        json_schema_extra=_rules(
            *SHARED_RULES,
            {"not": {**_is("echo", True), **_set("logprobs", "integer")}},
        )
    )

    prompt: (
        Text
        | Annotated[list[Text], Field(min_length=1)]
        | TokenIds
        | Annotated[list[TokenIds], Field(min_length=1)]
    )
    max_tokens: MaxTokens | None = Field(
        COMPLETIONS_DEFAULT_MAX_TOKENS, description=f"null: {MAX_TOKENS_DEFAULT}"
    )
    logprobs: Logprobs | None = None  # how many top logprobs per token, besides the sampled one
    echo: bool = False

    @field_validator("prompt", mode="before")
    @classmethod
    def _check_prompt(cls, prompt: Any) -> Any:
        # Checked first, so the error names the field rather than each member of its union type.
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


class ChatCompletionRequest(OpenAIRequest):
    model_config = ConfigDict(
        json_schema_extra=_rules(
            *SHARED_RULES, {"if": _set("top_logprobs", "integer"), "then": _is("logprobs", True)}
        )
    )

    messages: list[ChatMessage] = Field(min_length=1)
    # Deprecated by OpenAI for max_completion_tokens.
    max_tokens: MaxTokens | None = Field(None, description=f"default: {MAX_TOKENS_DEFAULT}")
    max_completion_tokens: MaxTokens | None = Field(
        None, description=f"default: {MAX_TOKENS_DEFAULT}"
    )
    logprobs: bool = False
    top_logprobs: Logprobs | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = Field(
        default=None,
        json_schema_extra={"propertyNames": {"not": {"enum": list(TEMPLATE_ARGUMENTS)}}},
    )

    @field_validator("chat_template_kwargs")
    @classmethod
    def _check_template_kwargs(cls, kwargs: dict[str, Any] | None) -> dict[str, Any] | None:
        taken = sorted(set(kwargs or ()) & set(TEMPLATE_ARGUMENTS))
        if taken:
            raise ValueError(f"may not set {', '.join(taken)}")
        return kwargs

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
