"""``/v1/completions``: prompts in, one choice per (prompt, n) out, whole or streamed."""

import time
from collections.abc import AsyncGenerator

from pdserve.engine.outputs import CompletionOutput
from pdserve.router.engine_client import EngineClient
from pdserve.router.engine_inputs import completion_budget, completion_prompts, sampling_params
from pdserve.router.logprobs import completion_logprobs
from pdserve.router.openai_requests import CompletionRequest
from pdserve.router.openai_responses import Completion, CompletionChoice, Usage
from pdserve.router.request_group import RequestGroup, start_group


async def _start(request: CompletionRequest, client: EngineClient, request_id: str) -> RequestGroup:
    prompts = completion_prompts(request, client.tokenizer)
    max_tokens = completion_budget(
        request.max_tokens, [len(p) for p in prompts], client.max_model_len, "prompt"
    )
    params = sampling_params(
        max_tokens=max_tokens, logprobs=request.logprobs, **request.sampling_kwargs()
    )
    return await start_group(client, request_id, prompts, params, request.priority)


class _Choices:
    """Turns a choice's output (whole, or one delta at a time) into OpenAI choices, tracking
    what each choice has sent: its echoed prompt once, and logprob text offsets."""

    def __init__(self, request: CompletionRequest, client: EngineClient, n: int) -> None:
        self.request = request
        self.client = client
        self.n = n
        self.started: set[int] = set()
        self.offsets: dict[int, int] = {}  # text offset of a choice's next logprob token

    def _echo(self, index: int) -> str:
        prompt = self.request.prompts[index // self.n]
        if isinstance(prompt, str):
            return prompt
        return self.client.tokenizer.decode(prompt, skip_special_tokens=False)

    def choice(self, index: int, output: CompletionOutput) -> CompletionChoice:
        first = index not in self.started
        self.started.add(index)
        logprobs = None
        if self.request.logprobs is not None:  # never with echo, so offsets start at 0
            logprobs = completion_logprobs(
                output.token_ids,
                output.logprobs or [],
                self.offsets.get(index, 0),
                self.request.return_tokens_as_token_ids,
            )
            self.offsets[index] = self.offsets.get(index, 0) + sum(map(len, logprobs.tokens))
        return CompletionChoice(
            index=index,
            text=(self._echo(index) if self.request.echo and first else "") + output.text,
            logprobs=logprobs,
            finish_reason=output.finish_reason,
            stop_reason=output.stop_reason,
        )


async def complete(request: CompletionRequest, client: EngineClient, request_id: str) -> Completion:
    created = int(time.time())
    group = await _start(request, client, request_id)
    try:
        async for _ in group:
            pass
    finally:
        group.close()
    choices = _Choices(request, client, group.n)
    return Completion(
        id=request_id,
        created=created,
        model=client.model_name,
        choices=[choices.choice(i, output.outputs[0]) for i, output in enumerate(group.outputs)],
        usage=Usage.of(group.token_counts()),
    )


async def stream_completion(
    request: CompletionRequest, client: EngineClient, request_id: str
) -> AsyncGenerator[Completion, None]:
    """Starts the request (so refusals raise here, before any byte is sent), then returns its
    chunks; closing them aborts the request."""
    group = await _start(request, client, request_id)
    return _chunks(request, client, request_id, group)


async def _chunks(
    request: CompletionRequest, client: EngineClient, request_id: str, group: RequestGroup
) -> AsyncGenerator[Completion, None]:
    created = int(time.time())
    choices = _Choices(request, client, group.n)
    try:
        async for index, delta in group:
            yield Completion(
                id=request_id,
                created=created,
                model=client.model_name,
                choices=[choices.choice(index, delta.outputs[0])],
            )
        if request.include_usage:
            yield Completion(
                id=request_id,
                created=created,
                model=client.model_name,
                choices=[],
                usage=Usage.of(group.token_counts()),
            )
    finally:
        group.close()
