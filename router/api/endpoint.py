"""What the OpenAI generation endpoints share: the request starts as a ``RequestGroup`` (so a
refusal raises before any byte is sent), then is answered whole or as a stream of chunks whose
end, or early close, closes the group (aborting what is unfinished).

Each endpoint (``chat.py``, ``completions.py``) says only how its request starts and how the
group's outputs become its response and its chunks.
"""

import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, Generic, Protocol, TypeVar

from pydantic import BaseModel

from pdserve.router.api.admission import InFlightLimit
from pdserve.router.api.engine_client import EngineClient
from pdserve.router.api.engine_inputs import completion_budget, sampling_params
from pdserve.router.api.openai_responses import Usage
from pdserve.router.api.request_group import RequestGroup, start_group

RequestT = TypeVar("RequestT", contravariant=True)
ResponseT = TypeVar("ResponseT", covariant=True)
ChunkT = TypeVar("ChunkT")
BodyT = TypeVar("BodyT", bound=BaseModel)


class Call(Generic[RequestT]):
    """One API call: its request, the model's client and bound on requests in flight, its id and
    creation time."""

    def __init__(
        self, request: RequestT, client: EngineClient, limit: InFlightLimit, id_prefix: str
    ) -> None:
        self.request = request
        self.client = client
        self.limit = limit
        self.id = f"{id_prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    async def start(
        self, prompts: list[list[int]], max_tokens: int | None, logprobs: int | None, field: str
    ) -> RequestGroup:
        """Starts the group for ``prompts`` with the request's sampling settings (the model's
        defaults for those it left out); ``max_tokens`` (None: the model's default, else what the
        context leaves) is checked against each prompt, blamed on ``field``."""
        request, defaults = self.request, self.client.generation_defaults
        prompt_lens = [len(p) for p in prompts]
        budget = completion_budget(
            max_tokens, prompt_lens, self.client.max_model_len, field, defaults
        )
        fields = defaults.fill(request.sampling_kwargs())
        params = sampling_params(max_tokens=budget, logprobs=logprobs, **fields)
        return await start_group(
            self.client, self.id, prompts, params, request.priority, self.limit
        )

    def body(self, cls: type[BodyT], choices: list[Any], usage: Usage | None = None) -> BodyT:
        """A response or chunk of this call: ``cls`` with its id, time, model and ``choices``."""
        return cls(
            id=self.id,
            created=self.created,
            model=self.client.model_name,
            choices=choices,
            usage=usage,
        )


class Endpoint(Protocol[RequestT, ResponseT, ChunkT]):
    path: str  # where the HTTP API serves it
    id_prefix: str

    async def start(self, call: Call[RequestT]) -> RequestGroup: ...

    def response(self, call: Call[RequestT], group: RequestGroup) -> ResponseT:
        """The whole answer, from the finished group's outputs."""
        ...

    def chunks(self, call: Call[RequestT], group: RequestGroup) -> AsyncGenerator[ChunkT, None]:
        """The streamed answer, read from the group as it runs."""
        ...


async def answer_whole(
    endpoint: Endpoint[RequestT, ResponseT, ChunkT], call: Call[RequestT]
) -> ResponseT:
    group = await endpoint.start(call)
    await group.finish()
    return endpoint.response(call, group)


async def answer_stream(
    endpoint: Endpoint[RequestT, ResponseT, ChunkT], call: Call[RequestT]
) -> "ChunkStream[ChunkT]":
    """Starts the request, then returns its chunks; closing them aborts the request."""
    group = await endpoint.start(call)
    return ChunkStream(group, endpoint.chunks(call, group))


class ChunkStream(AsyncIterator[ChunkT]):
    """A started request's chunks. Closing them closes the request group (aborting what is
    unfinished, giving its slot back) even if they were never read, where a generator's
    ``finally`` would not run."""

    def __init__(self, group: RequestGroup, chunks: AsyncGenerator[ChunkT, None]) -> None:
        self._group = group
        self._chunks = chunks

    async def __anext__(self) -> ChunkT:
        return await anext(self._chunks)

    async def aclose(self) -> None:
        self._group.close()
        await self._chunks.aclose()
