"""One request's side of the async engine, on its caller's event loop: the add's outcome, then
the output.

The engine thread calls ``send`` to run ``settle``, ``put`` or ``fail`` on that loop. Deltas the
consumer has not taken yet merge into one chunk, so a slow consumer gets fewer, bigger chunks.
"""

import asyncio
from collections.abc import Callable
from typing import Any

from pdserve.engine.outputs import RequestOutput


class RequestStream:
    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.added = self.loop.create_future()
        self.chunk: RequestOutput | None = None
        self.error: BaseException | None = None
        self.ready = asyncio.Event()

    def send(self, method: Callable[..., None], *args: Any) -> bool:
        # Called from the engine thread; False when the caller's loop is closed (nobody listens).
        try:
            self.loop.call_soon_threadsafe(method, *args)
        except RuntimeError:
            return False
        return True

    def settle(self, error: BaseException | None) -> None:
        if self.added.done():  # generate() was cancelled while waiting for the add
            return
        if error is None:
            self.added.set_result(None)
        else:
            self.added.set_exception(error)

    def put(self, delta: RequestOutput) -> None:
        if self.chunk is None:
            self.chunk = delta
        else:
            self.chunk.add(delta)
        self.ready.set()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.ready.set()

    async def get(self) -> RequestOutput:
        while self.chunk is None and self.error is None:
            self.ready.clear()
            await self.ready.wait()
        if self.chunk is None:
            raise self.error
        chunk, self.chunk = self.chunk, None
        return chunk
