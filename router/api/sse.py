"""Server-sent events as OpenAI streams them, and a response that cancels when the client leaves.

A stream is ``data: <json>\\n\\n`` per chunk and ends with ``data: [DONE]``. An error after the
status line went out can only be reported in-band: one ``data: {"error": ...}`` event, then done.
"""

import json
import logging
from collections.abc import AsyncIterator
from typing import Protocol

import anyio
from pydantic import BaseModel
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from pdserve.router.api.errors import INTERNAL, to_api_error

logger = logging.getLogger(__name__)

DONE_DATA = "[DONE]"  # the last event's data


def sse(payload: str) -> str:
    return f"data: {payload}\n\n"


DONE = sse(DONE_DATA)


class Chunks(Protocol):
    """A stream's chunks: read in turn; closing them cancels the work behind them."""

    def __aiter__(self) -> AsyncIterator[BaseModel]: ...

    async def aclose(self) -> None: ...


async def event_stream(chunks: Chunks) -> AsyncIterator[str]:
    """Frames ``chunks`` as SSE; closing this stream closes ``chunks`` (which cancels the work)."""
    try:
        async for chunk in chunks:
            yield sse(chunk.model_dump_json())
    except Exception as error:
        api_error = to_api_error(error)
        if api_error.kind is INTERNAL:
            logger.exception("stream failed")
        yield sse(json.dumps(api_error.envelope()))
    finally:
        await chunks.aclose()
    yield DONE


class EventStreamResponse(StreamingResponse):
    """An SSE response whose body is always closed when it ends: on completion, on a failed send,
    and as soon as the client disconnects, even while no token is being sent."""

    media_type = "text/event-stream"

    def __init__(self, chunks: Chunks) -> None:
        super().__init__(event_stream(chunks))
        self._chunks = chunks

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with anyio.create_task_group() as tasks:

            async def cancel_on_disconnect() -> None:
                await self.listen_for_disconnect(receive)
                tasks.cancel_scope.cancel()

            tasks.start_soon(cancel_on_disconnect)
            try:
                await self.stream_response(send)
            except OSError:  # the client went away mid-send
                logger.info("client disconnected mid-stream")
            finally:
                # The body's cleanup is synchronous (cancelling tasks), so a cancelled scope
                # cannot interrupt it. The chunks are closed too: a body cut off before its
                # first chunk was never started, so its own `finally` does not run.
                await self.body_iterator.aclose()
                await self._chunks.aclose()
                tasks.cancel_scope.cancel()
