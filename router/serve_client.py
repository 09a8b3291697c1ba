"""An ``EngineClient`` over the worker pools' Serve handles: the disaggregated request flow.

A prompt shorter than ``local_prefill_max_tokens``, or any prompt when no prefill pool is
configured, goes straight to a decode replica, which prefills it itself. Otherwise a prefill
replica runs it to its first token and holds its KV under a lease; that token goes to the client
at once (``first_token.py``) while a decode replica pulls the KV and streams the rest. Closing the
stream cancels the calls, so the replicas abort the request and free its blocks.
"""

import collections
import logging
from collections.abc import AsyncIterator
from typing import Literal

from ray.exceptions import RayTaskError
from ray.serve.handle import DeploymentHandle

from pdserve.cluster.config import ServedModel
from pdserve.cluster.messages import GenerateRequest, RemotePrefilled
from pdserve.engine.config import ModelConfig
from pdserve.engine.errors import EngineStoppedError
from pdserve.engine.outputs import RequestOutput
from pdserve.engine.prefix_hash import extend_block_hashes
from pdserve.engine.sampling_params import SamplingParams
from pdserve.engine.tokenizer import Tokenizer
from pdserve.router.first_token import as_first_chunk, streams_early, without_first_token
from pdserve.router.timing import mark_upstream_call, mark_upstream_output

logger = logging.getLogger(__name__)

Decision = Literal["local", "remote"]


class ServeEngineClient:
    def __init__(
        self,
        served: ServedModel,
        prefill: DeploymentHandle | None,
        decode: DeploymentHandle,
    ) -> None:
        self.served = served
        self.model_name = served.name
        engine_config = served.engine_config()
        self.max_model_len = engine_config.effective_max_model_len(
            ModelConfig.from_pretrained(served.path)
        )
        self._block_size = engine_config.block_size
        self.tokenizer = Tokenizer.from_pretrained(served.path)
        self._prefill = prefill
        self._decode = decode.options(stream=True, method_name="generate")
        self._health = decode.options(method_name="check_health")
        self.route_decisions: collections.Counter[Decision] = collections.Counter()

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        priority: int = 0,
    ) -> AsyncIterator[RequestOutput]:
        block_hashes: list[bytes] = []
        extend_block_hashes(block_hashes, prompt_token_ids, self._block_size)
        request = GenerateRequest(
            request_id, prompt_token_ids, params, priority, tuple(block_hashes)
        )
        decision = self._decide(prompt_token_ids)
        self.route_decisions[decision] += 1
        work: GenerateRequest | RemotePrefilled = request
        first: RequestOutput | None = None  # streamed already; the decode side repeats it
        try:
            mark_upstream_call()
            if decision == "remote":
                prefill = await self._prefill.prefill.remote(request)
                mark_upstream_output(prefill.first_output)
                if prefill.kv is None:  # it ended at its first token
                    yield prefill.first_output
                    return
                work = RemotePrefilled(request, prefill)
                if streams_early(params):
                    first = prefill.first_output
                    yield as_first_chunk(first)
            stream = self._decode.remote(work)
            try:
                async for chunk in stream:
                    mark_upstream_output(chunk)
                    if first is not None:
                        chunk, first = without_first_token(chunk, first), None
                        if chunk is None:
                            continue
                    yield chunk
            finally:
                stream.cancel()
        except RayTaskError as error:  # the replica's own exception, e.g. a RequestError
            raise error.cause from None

    async def check_health(self) -> None:
        try:
            await self._health.remote()
        except Exception as error:
            raise EngineStoppedError(f"{self.model_name}: decode pool unhealthy: {error}") from None

    def _decide(self, prompt_token_ids: list[int]) -> Decision:
        if self._prefill is None:
            return "local"
        if len(prompt_token_ids) < self.served.routing.local_prefill_max_tokens:
            return "local"
        return "remote"
