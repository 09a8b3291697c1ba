"""``/v1/chat/completions``: messages through the model's chat template, n choices, whole or
streamed (a choice's first chunk carries the assistant role, its last the finish reason)."""

from collections.abc import AsyncGenerator

from pdserve.engine.outputs import CompletionOutput
from pdserve.router.api.endpoint import Call
from pdserve.router.api.engine_inputs import chat_prompt
from pdserve.router.api.logprobs import chat_logprobs
from pdserve.router.api.openai_requests import ChatCompletionRequest
from pdserve.router.api.openai_responses import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatLogprobs,
    DeltaMessage,
    Usage,
)
from pdserve.router.api.request_group import RequestGroup


def _logprobs(request: ChatCompletionRequest, output: CompletionOutput) -> ChatLogprobs | None:
    if not request.logprobs:
        return None
    return chat_logprobs(
        output.token_ids,
        output.logprobs or [],
        request.top_logprobs or 0,
        request.return_tokens_as_token_ids,
    )


class ChatEndpoint:
    path = "/v1/chat/completions"
    id_prefix = "chatcmpl"

    async def start(self, call: Call[ChatCompletionRequest]) -> RequestGroup:
        request = call.request
        prompt = chat_prompt(request, call.client.tokenizer)
        return await call.start(
            [prompt], request.requested_max_tokens, request.num_logprobs, "messages"
        )

    def response(self, call: Call[ChatCompletionRequest], group: RequestGroup) -> ChatCompletion:
        choices = [
            ChatChoice(
                index=i,
                message=AssistantMessage(content=output.text),
                logprobs=_logprobs(call.request, output.outputs[0]),
                finish_reason=output.finish_reason,
                stop_reason=output.outputs[0].stop_reason,
            )
            for i, output in enumerate(group.outputs)
        ]
        return call.body(ChatCompletion, choices, Usage.of(group.token_counts()))

    async def chunks(
        self, call: Call[ChatCompletionRequest], group: RequestGroup
    ) -> AsyncGenerator[ChatCompletionChunk, None]:
        # OpenAI opens every choice with the role and empty content.
        opening = [
            ChatChunkChoice(index=i, delta=DeltaMessage(role="assistant", content=""))
            for i in range(len(group.outputs))
        ]
        yield call.body(ChatCompletionChunk, opening)
        async for index, delta in group:
            output = delta.outputs[0]
            choice = ChatChunkChoice(
                index=index,
                delta=DeltaMessage(content=output.text),
                logprobs=_logprobs(call.request, output),
                finish_reason=output.finish_reason,
                stop_reason=output.stop_reason,
            )
            yield call.body(ChatCompletionChunk, [choice])
        if call.request.include_usage:
            yield call.body(ChatCompletionChunk, [], Usage.of(group.token_counts()))


CHAT = ChatEndpoint()
