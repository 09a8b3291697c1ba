"""An ``EngineClient`` whose requests wait at a gate before they reach the engine: it holds
requests in flight in the router for as long as a test needs, without timing races."""

import asyncio
import threading
from collections.abc import AsyncIterator

from pdserve.engine.outputs import RequestOutput
from pdserve.engine.sampling_params import SamplingParams
from pdserve.tests.e2e.local_client import LocalEngineClient

POLL_S = 0.01


class GatedClient:
    """``inner``'s model behind ``gate``: while it is clear, new requests wait (open at first)."""

    def __init__(self, inner: LocalEngineClient) -> None:
        self.inner = inner
        self.model_name = inner.model_name
        self.max_model_len = inner.max_model_len
        self.tokenizer = inner.tokenizer
        self.generation_defaults = inner.generation_defaults
        self.gate = threading.Event()
        self.gate.set()

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        priority: int = 0,
    ) -> AsyncIterator[RequestOutput]:
        # Polled: the test thread opens the gate, and a threading.Event cannot be awaited.
        while not self.gate.is_set():
            await asyncio.sleep(POLL_S)
        async for chunk in self.inner.generate(request_id, prompt_token_ids, params, priority):
            yield chunk

    async def check_health(self) -> None:
        await self.inner.check_health()
