"""An ``EngineClient`` over the worker pools' Serve handles: the disaggregated request flow.

A prompt goes straight to a decode replica, which prefills it itself, when ``disaggregation.py``
says so: no prefill pool, a part not cached at the decode replica under
``local_prefill_max_tokens``, no prefill replica up, or all of them saturated. Otherwise a prefill
replica runs it to its first token and holds its KV under a lease; that token goes to the client
at once (``first_token.py``) while a decode replica pulls the KV and streams the rest. Closing the
stream cancels the calls, so the replicas abort the request and free its blocks.
"""

import collections
import logging
from collections.abc import AsyncIterator

from ray.exceptions import RayActorError, RayTaskError
from ray.serve.handle import DeploymentHandle

from pdserve.engine.config import ModelConfig
from pdserve.engine.errors import EngineStoppedError
from pdserve.engine.generation_config import load_generation_defaults
from pdserve.engine.outputs import RequestOutput
from pdserve.engine.prefix_hash import extend_block_hashes
from pdserve.engine.sampling_params import SamplingParams
from pdserve.engine.tokenizer import Tokenizer
from pdserve.router.dispatch.disaggregation import Decision, decide
from pdserve.router.dispatch.first_token import as_first_chunk, streams_early, without_first_token
from pdserve.router.dispatch.migration import continuation, migrating
from pdserve.router.dispatch.placement import Role, placement_for
from pdserve.router.metrics import RouterMetrics
from pdserve.router.timing import mark_upstream_call, mark_upstream_output
from pdserve.serving.config import ServedModel
from pdserve.serving.messages import GenerateRequest, PrefillResult, RemotePrefilled

logger = logging.getLogger(__name__)


class ServeEngineClient:
    def __init__(
        self,
        served: ServedModel,
        prefill: DeploymentHandle | None,
        decode: DeploymentHandle,
        metrics: RouterMetrics | None,
    ) -> None:
        """``metrics``: where this model's requests are timed and routes counted (None: not)."""
        self.served = served
        self._metrics = metrics
        self.model_name = served.name
        engine_config = served.engine_config()
        self.max_model_len = engine_config.effective_max_model_len(
            ModelConfig.from_pretrained(served.path)
        )
        self._block_size = engine_config.block_size
        self.tokenizer = Tokenizer.from_pretrained(served.path)
        self.generation_defaults = load_generation_defaults(engine_config)
        # Built now, so their request routers (the pools' placements) exist before the first
        # request.
        self._prefill = None if prefill is None else prefill.options(method_name="prefill")
        self._release = None if prefill is None else prefill.options(method_name="release")
        self._decode = decode.options(stream=True, method_name="generate")
        self._health = decode.options(method_name="check_health")
        # "local" and "remote", and per reason (e.g. "local:cached"): where prompts prefilled;
        # "migrated": continuations after a lost decode replica.
        self.route_decisions: collections.Counter[str] = collections.Counter()

    def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        priority: int = 0,
    ) -> AsyncIterator[RequestOutput]:
        """Streams the request's deltas from the workers, decided, routed, timed, and moved to
        another decode replica if its own is lost (``migration.py``)."""
        block_hashes: list[bytes] = []
        extend_block_hashes(block_hashes, prompt_token_ids, self._block_size)
        request = GenerateRequest(
            request_id, prompt_token_ids, params, priority, tuple(block_hashes)
        )
        decision, reason = self._place(request)
        self.route_decisions[decision] += 1
        if decision == "local":
            self.route_decisions[f"local:{reason}"] += 1

        def resume(sent: list[int]) -> AsyncIterator[RequestOutput]:
            self.route_decisions["migrated"] += 1
            if self._metrics is not None:
                self._metrics.count_migration(self.model_name)
            moved = continuation(request, sent, self._block_size)
            self._place(moved, migrated=True)
            return self._run(moved, "local")

        def lost() -> bool:  # its decode replica left the pool while the call was in flight
            decode = placement_for(self.model_name, "decode")
            return decode is not None and decode.orphaned(request_id)

        chunks = migrating(
            request_id, self._run(request, decision), resume, self.served.migration_limit, lost
        )
        if self._metrics is None:
            return chunks
        self._metrics.count_decision(self.model_name, decision, reason)
        return self._metrics.observe(self.model_name, decision, chunks)

    def _place(self, request: GenerateRequest, migrated: bool = False) -> tuple[Decision, str]:
        """Picks the request's decode replica and whether it prefills there or remotely (and
        where); the choices go in ``request.replicas``. A migrated request prefills locally."""
        decode = placement_for(self.model_name, "decode")
        prefill = placement_for(self.model_name, "prefill")
        cached_tokens = 0
        if decode is not None and decode.num_replicas:
            placed = decode.place(request)
            request.replicas["decode"], cached_tokens = placed.replica, placed.cached_tokens
        if migrated:  # recovery in one hop: no prefill call, no KV lease to hand over
            return "local", "migrated"
        has_prefill_pool = self._prefill is not None
        decision, reason = decide(
            request, self.served.routing, has_prefill_pool, cached_tokens, prefill
        )
        if decision == "remote" and prefill is not None:
            request.replicas["prefill"] = prefill.place(request).replica
        if "decode" in request.replicas:  # it runs there, one token a step, once prefilled
            load = 1 if decision == "remote" else len(request.prompt_token_ids) - cached_tokens
            decode.reserve(request.replicas["decode"], request, load)
        return decision, reason

    async def _run(
        self, request: GenerateRequest, decision: Decision
    ) -> AsyncIterator[RequestOutput]:
        params = request.params
        work: GenerateRequest | RemotePrefilled = request
        first: RequestOutput | None = None  # streamed already; the decode side repeats it
        lease: str | None = None  # the prefill replica's hold on the KV, until a decode takes it
        try:
            mark_upstream_call()
            if decision == "remote":
                prefill = await self._remote_prefill(request)
                if prefill is not None:
                    mark_upstream_output(prefill.first_output)
                    if prefill.kv is None:  # it ended at its first token
                        yield prefill.first_output
                        return
                    work, lease = RemotePrefilled(request, prefill), prefill.kv.lease_id
                    if streams_early(params):
                        first = prefill.first_output
            stream = self._decode.remote(work)
            try:
                if first is not None:
                    yield as_first_chunk(first)
                async for chunk in stream:
                    lease = None  # the decode replica has the KV: its pull ended the lease
                    mark_upstream_output(chunk)
                    if first is not None:
                        chunk, first = without_first_token(chunk, first), None
                        if chunk is None:
                            continue
                    yield chunk
            finally:
                stream.cancel()
                if lease is not None:  # ended before a decode replica took the KV
                    self._release.remote(request, lease)
        except RayTaskError as error:  # the replica's own exception, e.g. a RequestError
            raise error.cause from None
        finally:  # its decode call, or the reservation for it
            self._ended("decode", request)

    async def _remote_prefill(self, request: GenerateRequest) -> PrefillResult | None:
        """The prefill replica's result; None if that replica was lost, so the request prefills
        at its decode replica instead."""
        try:
            return await self._prefill.remote(request)
        except RayActorError as error:
            logger.warning(
                "request %s: prefill replica lost (%s); prefilling at the decode replica",
                request.request_id,
                type(error).__name__,
            )
            request.replicas.pop("prefill", None)
            return None
        finally:
            self._ended("prefill", request)

    def _ended(self, role: Role, request: GenerateRequest) -> None:
        """Tells the pool's placement (if it keeps count) that the request's call has ended."""
        placement = placement_for(self.model_name, role)
        if placement is not None:
            placement.ended(request.request_id)

    async def check_health(self) -> None:
        try:
            await self._health.remote()
        except Exception as error:
            raise EngineStoppedError(f"{self.model_name}: decode pool unhealthy: {error}") from None
