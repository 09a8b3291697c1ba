"""The worker pools' Serve ``RequestRouter`` (Serve's alpha API, reached through
``serving/ray_compat.py``): it sends a request where the pool's ``PoolPlacement``
(``placement.py``) puts it.

Serve hands this router each replica's routing stats (its load and KV events); the router passes
them on to the placement and tells it where each request went. A request the ingress placed
already (``GenerateRequest.replicas``) goes to that replica while it is a candidate; any other,
or one whose replica is gone, is placed here among the candidates. The rest follow as a second
rank, for Serve to try if the first refuses.
"""

import random
from typing import Any

from pdserve.router.dispatch.placement import PoolPlacement, Role, register
from pdserve.serving.messages import GenerateRequest, RemotePrefilled
from pdserve.serving.ray_compat import (
    FIFOMixin,
    PendingRequest,
    ReplicaID,
    RequestRouter,
    RunningReplica,
)


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
        placement = PoolPlacement(role, block_size, kv_overlap_weight, load_weight)
        self._placement = register(pool, role, placement)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        self._placement.sync({r.replica_id.unique_id: r.routing_stats for r in replicas})

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
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        target = request.replicas.get(self._role)
        if target not in by_id:
            target = self._placement.place(request, list(by_id)).replica
        chosen = by_id.pop(target)
        return [[chosen], list(by_id.values())] if by_id else [[chosen]]

    def on_request_routed(
        self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any
    ) -> None:
        request = _generate_request(pending_request)
        if request is not None:
            self._placement.sent(replica_id.unique_id, request)


def _generate_request(pending_request: PendingRequest | None) -> GenerateRequest | None:
    """The request a prefill or generate call carries; None for other calls (stats, health)."""
    work = pending_request.args[0] if pending_request is not None and pending_request.args else None
    if isinstance(work, RemotePrefilled):
        return work.request
    return work if isinstance(work, GenerateRequest) else None
