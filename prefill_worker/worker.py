"""The prefill pool's replica: runs prompts to their first token and holds the KV for a decoder.

The engine batches and chunks prompts like any other; a request that will go on decoding is run
with ``max_tokens=1`` and ``hold_kv``, so when its first token is sampled its blocks are exported
under a lease (kvtransfer) instead of freed. The decode replica pulls them and ends the lease.
"""

import asyncio
import dataclasses

from pdserve.engine.outputs import RequestOutput
from pdserve.serving.messages import GenerateRequest, PrefillResult
from pdserve.serving.replica import EngineReplica


class PrefillWorker(EngineReplica):
    pool = "prefill"

    def __init__(self, served: dict) -> None:
        super().__init__(served)
        self.peer_info = self.connector.peer_info()
        self._not_held = asyncio.Event()
        self._not_held.set()
        self._num_held = 0

    async def hold_prefills(self, held: bool) -> None:
        """Test-only: while ``held``, every prefill call waits before its prompt reaches the
        engine, counted in ``stats()["held_prefills"]``; a test kills the replica while a
        request is inside its call (tests/e2e/test_migration.py)."""
        if held:
            self._not_held.clear()
        else:
            self._not_held.set()

    def stats(self) -> dict:
        return {**super().stats(), "held_prefills": self._num_held}

    async def prefill(self, request: GenerateRequest) -> PrefillResult:
        if not self._not_held.is_set():
            self._num_held += 1
            try:
                await self._not_held.wait()
            finally:
                self._num_held -= 1
        params = request.params
        decodes_on = params.max_tokens > 1
        first_params = dataclasses.replace(
            params, max_tokens=1, min_tokens=min(params.min_tokens, 1)
        )
        output: RequestOutput | None = None
        async for chunk in self.engine.generate(
            request.request_id,
            request.prompt_token_ids,
            first_params,
            request.priority,
            hold_kv=decodes_on,
        ):
            output = chunk
        # Stopped at the first token (EOS, a stop): nothing was held, nothing to decode.
        kv = output.kv_transfer_params if output.finish_reason == "length" else None
        return PrefillResult(output.without_prompt(), self.peer_info, kv)

    async def release(self, request: GenerateRequest, lease_id: str) -> None:
        """The router gave up on ``request`` before a decode replica took its KV (the client left
        at the first token, or the decode replica died): its blocks are freed now, not when the
        lease expires. ``request`` routes the call to this replica
        (``router/dispatch/kv_routing.py``)."""
        self.connector.drop_lease(lease_id)
