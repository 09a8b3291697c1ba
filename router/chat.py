"""``/v1/chat/completions``: messages through the model's chat template, n choices, whole or
streamed (a choice's first chunk carries the assistant role, its last the finish reason)."""

import time
from collections.abc import AsyncGenerator

from pdserve.engine.outputs import CompletionOutput
from pdserve.router.engine_client import EngineClient
from pdserve.router.engine_inputs import chat_prompt, completion_budget, sampling_params
from pdserve.router.logprobs import chat_logprobs
from pdserve.router.openai_requests import ChatCompletionRequest
from pdserve.router.openai_responses import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatLogprobs,
    DeltaMessage,
    Usage,
)
from pdserve.router.request_group import RequestGroup, start_group


async def _start(
    request: ChatCompletionRequest, client: EngineClient, request_id: str
) -> RequestGroup:
    prompt = chat_prompt(request, client.tokenizer)
    max_tokens = completion_budget(
        request.requested_max_tokens, [len(prompt)], client.max_model_len, "messages"
    )
    params = sampling_params(
        max_tokens=max_tokens, logprobs=request.num_logprobs, **request.sampling_kwargs()
    )
    return await start_group(client, request_id, [prompt], params, request.priority)


def _logprobs(request: ChatCompletionRequest, output: CompletionOutput) -> ChatLogprobs | None:
    if not request.logprobs:
        return None
    return chat_logprobs(
        output.token_ids,
        output.logprobs or [],
        request.top_logprobs or 0,
        request.return_tokens_as_token_ids,
    )


async def complete_chat(
    request: ChatCompletionRequest, client: EngineClient, request_id: str
) -> ChatCompletion:
    created = int(time.time())
    group = await _start(request, client, request_id)
    try:
        async for _ in group:
            pass
    finally:
        group.close()
    choices = [
        ChatChoice(
            index=i,
            message=AssistantMessage(content=output.text),
            logprobs=_logprobs(request, output.outputs[0]),
            finish_reason=output.finish_reason,
            stop_reason=output.outputs[0].stop_reason,
        )
        for i, output in enumerate(group.outputs)
    ]
    return ChatCompletion(
        id=request_id,
        created=created,
        model=client.model_name,
        choices=choices,
        usage=Usage.of(group.token_counts()),
    )


async def stream_chat(
    request: ChatCompletionRequest, client: EngineClient, request_id: str
) -> AsyncGenerator[ChatCompletionChunk, None]:
    """Starts the request (so refusals raise here, before any byte is sent), then returns its
    chunks; closing them aborts the request."""
    group = await _start(request, client, request_id)
    return _chunks(request, client, request_id, group)


async def _chunks(
    request: ChatCompletionRequest, client: EngineClient, request_id: str, group: RequestGroup
) -> AsyncGenerator[ChatCompletionChunk, None]:
    created = int(time.time())

    def chunk(choices: list[ChatChunkChoice], usage: Usage | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=request_id, created=created, model=client.model_name, choices=choices, usage=usage
        )

    try:
        # OpenAI opens every choice with the role and empty content.
        yield chunk(
            [
                ChatChunkChoice(index=i, delta=DeltaMessage(role="assistant", content=""))
                for i in range(len(group.outputs))
            ]
        )
        async for index, delta in group:
            output = delta.outputs[0]
            choice = ChatChunkChoice(
                index=index,
                delta=DeltaMessage(content=output.text),
                logprobs=_logprobs(request, output),
                finish_reason=output.finish_reason,
                stop_reason=output.stop_reason,
            )
            yield chunk([choice])
        if request.include_usage:
            yield chunk([], Usage.of(group.token_counts()))
    finally:
        group.close()
