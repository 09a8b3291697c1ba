"""KV-aware routing of the worker pools, as Ray Serve ``RequestRouter``s (Serve's alpha API; our
only use of it is this module).

Each replica reports, through ``record_routing_stats``, the hashes of the blocks in its prefix
cache and its load. For a request the router walks the prompt's hash chain (computed once by the
router, ``GenerateRequest.block_hashes``) and scores every replica:

    score = kv_overlap_weight * cached prefix tokens - load_weight * load tokens

Load is the prompt tokens a prefill replica has queued, or the KV tokens a decode replica holds,
plus the prompt tokens of the requests this router has sent it and not yet seen end. The ingress
says when a request ends (``request_done``): Serve's own completion callback does not fire for
unary calls over its gRPC transport (Ray 2.60: a prefill replica's calls stayed "in flight" after
they returned, and its replicas looked busier with each request). Between reports, blocks this
router sent a replica count as cached there, so a burst of requests sharing a prefix still lands
where the first one went.

Each router registers itself in ``pool_views`` under its pool (model name and role), so the
ingress in the same process can ask it about the pool before sending a request.
"""

import collections
import random
import threading
from typing import Any

from ray.serve.request_router import (
    FIFOMixin,
    PendingRequest,
    ReplicaID,
    RequestRouter,
    RunningReplica,
)

from pdserve.router import pool_views
from pdserve.router.pool_views import Role
from pdserve.serving.messages import GenerateRequest, RemotePrefilled

# Blocks a router remembers sending to one replica before its own report catches up.
MAX_RECENT_BLOCKS = 65536


class KVAwareRouter(FIFOMixin, RequestRouter):
    def initialize_state(
        self,
        role: Role = "prefill",
        pool: str = "",
        block_size: int = 16,
        kv_overlap_weight: float = 1.0,
        load_weight: float = 1.0,
    ) -> None:
        self._role = role
        self._block_size = block_size
        self._kv_weight = kv_overlap_weight
        self._load_weight = load_weight
        # Per replica, the hashes sent there (oldest first). Requests in flight: where each went
        # with its prompt tokens, by our request id, and the sum per replica. The lock: the
        # ingress's thread ends requests while this router's thread routes them.
        self._recent: dict[ReplicaID, collections.OrderedDict[bytes, None]] = {}
        self._in_flight: dict[str, tuple[ReplicaID, int]] = {}
        self._in_flight_tokens: collections.Counter[ReplicaID] = collections.Counter()
        self._lock = threading.Lock()
        pool_views.register(pool, role, self)

    # -- pool_views.PoolView, read from the ingress's thread --------------------------------------
    # Serve replaces `curr_replicas` and each replica's stats whole; the snapshots below copy what
    # this router's own thread changes in place.

    @property
    def num_replicas(self) -> int:
        return len(self.curr_replicas)

    def cached_prefix_tokens(self, request: GenerateRequest) -> int:
        replicas = list(self.curr_replicas.values())
        if not replicas:
            return 0
        best = max(replicas, key=lambda r: self._score(r, request))
        return self._overlap(best, request) * self._block_size

    def saturated(self, max_load_tokens: int) -> bool:
        replicas = list(self.curr_replicas.values())
        return bool(replicas) and all(self._load(r) >= max_load_tokens for r in replicas)

    def request_done(self, request_id: str) -> None:
        with self._lock:
            self._forget(request_id)

    # -- RequestRouter ----------------------------------------------------------------------------

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        request = _generate_request(pending_request)
        if request is None or not candidate_replicas:
            # Not a generate call (stats, health): any replica, at random. Serve takes the least
            # loaded of a rank, the first on a tie, so in order one replica would take them all.
            return [random.sample(candidate_replicas, len(candidate_replicas))]
        ranked = sorted(candidate_replicas, key=lambda r: self._score(r, request), reverse=True)
        return [[ranked[0]], ranked[1:]] if len(ranked) > 1 else [ranked]

    def on_request_routed(
        self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any
    ) -> None:
        request = _generate_request(pending_request)
        if request is None:
            return
        recent = self._recent.setdefault(replica_id, collections.OrderedDict())
        for block_hash in request.block_hashes:
            recent[block_hash] = None
            recent.move_to_end(block_hash)
        while len(recent) > MAX_RECENT_BLOCKS:
            recent.popitem(last=False)
        with self._lock:
            self._forget(request.request_id)  # routed again, e.g. after a rejection
            tokens = len(request.prompt_token_ids)
            self._in_flight[request.request_id] = (replica_id, tokens)
            self._in_flight_tokens[replica_id] += tokens

    def _forget(self, request_id: str) -> None:
        sent = self._in_flight.pop(request_id, None)
        if sent is not None:
            replica_id, tokens = sent
            self._in_flight_tokens[replica_id] -= tokens

    def _score(self, replica: RunningReplica, request: GenerateRequest) -> float:
        overlap_tokens = self._overlap(replica, request) * self._block_size
        return self._kv_weight * overlap_tokens - self._load_weight * self._load(replica)

    def _overlap(self, replica: RunningReplica, request: GenerateRequest) -> int:
        """The prompt's leading blocks cached at the replica, or sent there since its report."""
        stats = replica.routing_stats or {}
        cached = stats.get("cached_block_hashes", frozenset())
        recent = self._recent.get(replica.replica_id, {})
        overlap = 0
        for block_hash in request.block_hashes:
            if block_hash not in cached and block_hash not in recent:
                break
            overlap += 1
        return overlap

    def _load(self, replica: RunningReplica) -> int:
        """Tokens: a prefill replica's queued prompt tokens, a decode replica's held KV, plus the
        prompts in flight there."""
        stats = replica.routing_stats or {}
        if self._role == "prefill":
            load = stats.get("num_queued_prefill_tokens", 0)
        else:
            held = stats.get("num_blocks", 0) - stats.get("num_free_blocks", 0)
            load = held * self._block_size
        return load + self._in_flight_tokens[replica.replica_id]


def _generate_request(pending_request: PendingRequest | None) -> GenerateRequest | None:
    """The request a prefill or generate call carries; None for other calls (stats, health)."""
    work = pending_request.args[0] if pending_request is not None and pending_request.args else None
    if isinstance(work, RemotePrefilled):
        return work.request
    return work if isinstance(work, GenerateRequest) else None
