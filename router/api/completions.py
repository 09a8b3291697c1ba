"""``/v1/completions``: prompts in, one choice per (prompt, n) out, whole or streamed."""

from collections.abc import AsyncGenerator

from pdserve.engine.outputs import CompletionOutput
from pdserve.router.api.endpoint import Call
from pdserve.router.api.engine_client import EngineClient
from pdserve.router.api.engine_inputs import completion_prompts
from pdserve.router.api.logprobs import completion_logprobs
from pdserve.router.api.openai_requests import CompletionRequest
from pdserve.router.api.openai_responses import Completion, CompletionChoice, Usage
from pdserve.router.api.request_group import RequestGroup


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


class CompletionsEndpoint:
    path = "/v1/completions"
    id_prefix = "cmpl"

    async def start(self, call: Call[CompletionRequest]) -> RequestGroup:
        request = call.request
        prompts = completion_prompts(request, call.client.tokenizer)
        return await call.start(prompts, request.max_tokens, request.logprobs, "prompt")

    def response(self, call: Call[CompletionRequest], group: RequestGroup) -> Completion:
        choices = _Choices(call.request, call.client, group.n)
        whole = [choices.choice(i, out.outputs[0]) for i, out in enumerate(group.outputs)]
        return call.body(Completion, whole, Usage.of(group.token_counts()))

    async def chunks(
        self, call: Call[CompletionRequest], group: RequestGroup
    ) -> AsyncGenerator[Completion, None]:
        choices = _Choices(call.request, call.client, group.n)
        async for index, delta in group:
            yield call.body(Completion, [choices.choice(index, delta.outputs[0])])
        if call.request.include_usage:
            yield call.body(Completion, [], Usage.of(group.token_counts()))


COMPLETIONS = CompletionsEndpoint()
