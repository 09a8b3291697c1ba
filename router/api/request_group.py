"""The engine requests behind one API request, read as one stream.

An OpenAI request with several prompts and ``n`` completions each becomes one engine request per
(prompt, completion), prompt-major: choice ``i`` answers prompt ``i // n``. Each engine stream is
drained by its own task into one queue, so closing the group is a synchronous ``cancel`` of those
tasks (each closes its stream, which aborts the engine request) and needs no awaiting, even from
a cancelled caller.
"""

import asyncio
from collections.abc import AsyncIterator
from typing import NamedTuple

from pdserve.engine.outputs import CompletionOutput, RequestOutput
from pdserve.engine.sampling_params import SamplingParams, fan_out
from pdserve.router.api.admission import InFlightLimit
from pdserve.router.api.engine_client import EngineClient


class TokenCounts(NamedTuple):
    prompt_tokens: int  # each prompt once, however many completions it has (as OpenAI counts)
    completion_tokens: int
    cached_tokens: int  # of each prompt's first completion


class RequestGroup:
    def __init__(
        self,
        client: EngineClient,
        request_id: str,
        prompts: list[list[int]],
        params: SamplingParams,
        priority: int = 0,
        limit: InFlightLimit | None = None,
    ) -> None:
        """``limit``: the model's bound on requests in flight; the group holds a slot of it
        until it closes (raises the 429 when the model is full)."""
        self.prompts = prompts
        self.n = params.n
        children = [(prompt, child) for prompt in prompts for child in fan_out(params)]
        # What each choice has produced so far, accumulated as the group is read.
        self.outputs = [
            RequestOutput(f"{request_id}-{i}", None, prompt, [CompletionOutput(0)])
            for i, (prompt, _) in enumerate(children)
        ]
        self._events: asyncio.Queue[tuple[int, RequestOutput | Exception]] = asyncio.Queue()
        self._early: list[tuple[int, RequestOutput]] = []  # read while waiting for admission
        # Taken last before the tasks start, so nothing can fail between taking and closing.
        self._slot = None if limit is None else limit.acquire()
        self._tasks = [
            asyncio.ensure_future(
                self._drain(i, client.generate(output.request_id, prompt, child, priority))
            )
            for i, (output, (prompt, child)) in enumerate(zip(self.outputs, children, strict=True))
        ]

    async def _drain(self, index: int, stream: AsyncIterator[RequestOutput]) -> None:
        try:
            async for chunk in stream:
                self._events.put_nowait((index, chunk))
        except Exception as error:  # refusals and engine failures belong to the reader
            self._events.put_nowait((index, error))

    async def _next(self) -> tuple[int, RequestOutput]:
        index, event = await self._events.get()
        if isinstance(event, Exception):
            raise event
        return index, event

    async def wait_admitted(self) -> None:
        """Returns once every request has produced output (so the engine took it); raises the
        first refusal."""
        waiting = set(range(len(self._tasks)))
        while waiting:
            index, chunk = await self._next()
            self._early.append((index, chunk))
            waiting.discard(index)

    async def __aiter__(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        """Yields (choice index, delta) until every choice has finished."""
        num_finished = 0
        while num_finished < len(self.outputs):
            index, delta = self._early.pop(0) if self._early else await self._next()
            self.outputs[index].add(delta)
            num_finished += delta.finished
            yield index, delta

    async def finish(self) -> None:
        """Reads the group to its end (every choice whole in ``outputs``), then closes it."""
        try:
            async for _ in self:
                pass
        finally:
            self.close()

    def close(self) -> None:
        """Aborts every unfinished request of the group and gives its slot back; safe to call
        more than once."""
        for task in self._tasks:
            task.cancel()
        if self._slot is not None:
            self._slot.release()

    def token_counts(self) -> TokenCounts:
        return TokenCounts(
            prompt_tokens=sum(len(prompt) for prompt in self.prompts),
            completion_tokens=sum(len(output.token_ids) for output in self.outputs),
            cached_tokens=sum(output.num_cached_tokens for output in self.outputs[:: self.n]),
        )


async def start_group(
    client: EngineClient,
    request_id: str,
    prompts: list[list[int]],
    params: SamplingParams,
    priority: int = 0,
    limit: InFlightLimit | None = None,
) -> RequestGroup:
    """Starts the group and waits until the engine has admitted all of it (so a refusal can still
    become an error status); on a refusal or cancellation the whole group is aborted. Past
    ``limit`` it raises the 429 at once."""
    group = RequestGroup(client, request_id, prompts, params, priority, limit)
    try:
        await group.wait_admitted()
    except BaseException:
        group.close()
        raise
    return group
