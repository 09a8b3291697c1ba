"""The decode pool's replica: its own continuous-batching loop, fed by prompts it prefills itself
(aggregated path) or by requests a prefill replica began, whose KV it pulls first."""

from collections.abc import AsyncIterator

from pdserve.engine.outputs import RequestOutput
from pdserve.kvtransfer.engine_hooks import PeerPull
from pdserve.serving.messages import GenerateRequest, RemotePrefilled
from pdserve.serving.replica import EngineReplica


class DecodeWorker(EngineReplica):
    pool = "decode"

    async def generate(
        self, work: GenerateRequest | RemotePrefilled
    ) -> AsyncIterator[RequestOutput]:
        """Streams the request's deltas (new tokens only, not the prompt again); with a remote
        prefill, the first carries its token."""
        remote_kv = None
        request = work
        if isinstance(work, RemotePrefilled):
            request = work.request
            prefill = work.prefill
            first = prefill.first_output.outputs[0]
            remote_kv = PeerPull(
                self.connector,
                prefill.owner,
                prefill.kv,
                first.token_ids[0],
                first.logprobs[0] if first.logprobs else None,
            )
        async for chunk in self.engine.generate(
            request.request_id,
            request.prompt_token_ids,
            request.params,
            request.priority,
            remote_kv=remote_kv,
        ):
            yield chunk.without_prompt()
