"""Migration: a request whose decode replica dies mid-stream goes on at another one (Dynamo's name).

The router keeps the token ids the client has been sent. When the replica's stream breaks (its
actor died or cannot be reached), the request starts again elsewhere as a continuation: the prompt
plus those tokens, with the budget they used taken off. The new replica rebuilds their KV (from its
prefix cache, or by a prefill) and streams on from the next token, so the client sees no token
twice and none missing, and greedy output equals a fault-free run's. After ``migration_limit``
moves the request fails with ``EngineStoppedError``: the in-band error of a stream.

What a continuation cannot carry: presence and frequency penalties count only its new tokens (the
sent ones are prompt to it), and a stop string that straddles the break is not seen.

A replica's loss shows as its stream's error, when the transport notices: at once for a killed
process, whose connection closes, but only after a minute or more for a host that went silent (a
lost machine, a cut link). So a stream whose replica has left the pool (``lost``, from the
placement) and that has been silent for ``LOST_SILENCE_S`` counts as lost too. A replica Serve
stops gracefully leaves the pool as well, but goes on streaming until its requests end.
"""

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable

from ray.exceptions import RayActorError

from pdserve.engine.errors import EngineStoppedError
from pdserve.engine.outputs import RequestOutput
from pdserve.engine.prefix_hash import extend_block_hashes
from pdserve.serving.messages import GenerateRequest

logger = logging.getLogger(__name__)

LOST_SILENCE_S = 2.0  # no chunk this long from a replica that left the pool: it is lost


class ReplicaLost(RayActorError):
    """A stream's replica left the pool and the stream went silent."""


async def _until_lost(
    stream: AsyncIterator[RequestOutput], lost: Callable[[], bool]
) -> AsyncIterator[RequestOutput]:
    """``stream``'s chunks; raises ``ReplicaLost`` (closing ``stream``) once it has been silent
    for ``LOST_SILENCE_S`` while ``lost()`` holds."""
    chunks = aiter(stream)
    try:
        while True:
            step = asyncio.ensure_future(anext(chunks))
            try:
                while not (await asyncio.wait({step}, timeout=LOST_SILENCE_S))[0]:
                    if lost():
                        raise ReplicaLost()
            finally:
                if not step.done():  # lost, or the reader went away: the stream ends here
                    step.cancel()
                    await asyncio.wait({step})
            try:
                chunk = step.result()
            except StopAsyncIteration:
                return
            yield chunk
    finally:
        await chunks.aclose()


def continuation(request: GenerateRequest, sent: list[int], block_size: int) -> GenerateRequest:
    """``request`` after its first ``len(sent)`` output tokens, ``sent``, as a new request; not
    placed yet (its ``replicas`` are empty)."""
    params = request.params
    params = dataclasses.replace(
        params,
        max_tokens=params.max_tokens - len(sent),
        min_tokens=max(0, params.min_tokens - len(sent)),
    )
    prompt = request.prompt_token_ids + sent
    hashes = list(request.block_hashes)
    extend_block_hashes(hashes, prompt, block_size)
    return GenerateRequest(request.request_id, prompt, params, request.priority, tuple(hashes))


async def migrating(
    request_id: str,
    first: AsyncIterator[RequestOutput],
    resume: Callable[[list[int]], AsyncIterator[RequestOutput]],
    migration_limit: int,
    lost: Callable[[], bool] = lambda: False,
) -> AsyncIterator[RequestOutput]:
    """Streams ``first``; each time a replica is lost (its stream fails, or it left the pool per
    ``lost()`` and went silent), streams on from ``resume(sent_tokens)``."""
    stream = first
    sent: list[int] = []
    num_cached_tokens: int | None = None  # the first replica's: a continuation's are not the API's
    migrations = 0
    while True:
        try:
            async for chunk in _until_lost(stream, lost):
                if num_cached_tokens is None:
                    num_cached_tokens = chunk.num_cached_tokens
                sent += chunk.outputs[0].token_ids
                yield dataclasses.replace(chunk, num_cached_tokens=num_cached_tokens)
            return
        except RayActorError as error:
            if migrations == migration_limit:
                raise EngineStoppedError(
                    f"request {request_id}: its decode replica was lost and it has moved "
                    f"{migrations} times (migration_limit {migration_limit})"
                ) from None
            migrations += 1
            logger.warning(
                "request %s: decode replica lost (%s); migration %d with %d tokens sent",
                request_id,
                type(error).__name__,
                migrations,
                len(sent),
            )
            stream = resume(list(sent))
