"""Conditional disaggregation: whether a prompt prefills on a prefill replica or on its decoder.

Remote prefill pays a KV transfer to spare the decode replica a long prefill, so it is worth it
only for a long enough *uncached* part: the prompt less the prefix the chosen decode replica
already holds. A prompt also prefills locally when no prefill replica is up, or when every one is
saturated (its queued prompt tokens at ``prefill_queue_max_tokens``), as in Dynamo's conditional
disaggregation. The pools' state comes from their placements (``placement.py``); under Serve's
default router only the prompt's length is known.
"""

from typing import Literal, get_args

from pdserve.router.dispatch.placement import PoolPlacement
from pdserve.serving.config import RoutingConfig
from pdserve.serving.messages import GenerateRequest

Decision = Literal["local", "remote"]
# Why a prompt prefilled where it did, for the route-decision counters.
Reason = Literal[
    "no_prefill_pool", "short", "cached", "no_prefill_replica", "saturated", "uncached"
]


def possible_routes(has_prefill_pool: bool) -> list[tuple[Decision, Reason]]:
    """Each (decision, reason) that ``decide`` can give a model's requests, so that their counters
    start at 0."""
    if not has_prefill_pool:
        return [("local", "no_prefill_pool")]
    local = [r for r in get_args(Reason) if r not in ("no_prefill_pool", "uncached")]
    return [("local", reason) for reason in local] + [("remote", "uncached")]


def decide(
    request: GenerateRequest,
    routing: RoutingConfig,
    has_prefill_pool: bool,
    cached_tokens: int,
    prefill: PoolPlacement | None,
) -> tuple[Decision, Reason]:
    """Where ``request`` prefills, and why. ``cached_tokens``: its prompt's prefix cached at the
    decode replica it goes to; a prefill pool without a placement counts as up and unloaded."""
    if not has_prefill_pool:
        return "local", "no_prefill_pool"
    num_tokens = len(request.prompt_token_ids)
    if num_tokens < routing.local_prefill_max_tokens:
        return "local", "short"
    if num_tokens - cached_tokens < routing.local_prefill_max_tokens:
        return "local", "cached"
    if prefill is not None:
        if prefill.num_replicas == 0:
            return "local", "no_prefill_replica"
        if prefill.saturated(routing.prefill_queue_max_tokens):
            return "local", "saturated"
    return "remote", "uncached"
