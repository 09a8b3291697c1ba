"""Conditional disaggregation (router/dispatch/disaggregation.py): each reason a prompt prefills
locally, and the remote path when none holds; each one is among the routes counted from 0."""

from dataclasses import dataclass

import pytest

from pdserve.engine.sampling_params import SamplingParams
from pdserve.router.dispatch.disaggregation import decide, possible_routes
from pdserve.serving.config import RoutingConfig
from pdserve.serving.messages import GenerateRequest

ROUTING = RoutingConfig(local_prefill_max_tokens=100, prefill_queue_max_tokens=1000)


@dataclass
class Pool:
    """The prefill pool's placement, as ``decide`` asks it."""

    num_replicas: int = 1
    load: int = 0  # every replica's

    def saturated(self, max_load_tokens: int) -> bool:
        return self.num_replicas > 0 and self.load >= max_load_tokens


def _request(num_tokens: int) -> GenerateRequest:
    return GenerateRequest("r", list(range(num_tokens)), SamplingParams(), 0, ())


@pytest.mark.parametrize(
    ("tokens", "cached", "prefill", "has_prefill_pool", "want"),
    [
        (500, 0, Pool(), False, ("local", "no_prefill_pool")),
        (99, 0, Pool(), True, ("local", "short")),
        (100, 0, Pool(), True, ("remote", "uncached")),
        # 500 tokens, 416 cached at the decode replica: 84 left to prefill there.
        (500, 416, Pool(), True, ("local", "cached")),
        (500, 400, Pool(), True, ("remote", "uncached")),
        (500, 0, Pool(num_replicas=0), True, ("local", "no_prefill_replica")),
        (500, 0, Pool(load=1000), True, ("local", "saturated")),
        (500, 0, Pool(load=999), True, ("remote", "uncached")),
        # Without placements (Serve's default router) only the length counts.
        (500, 0, None, True, ("remote", "uncached")),
    ],
)
def test_where_a_prompt_prefills(tokens, cached, prefill, has_prefill_pool, want) -> None:
    assert decide(_request(tokens), ROUTING, has_prefill_pool, cached, prefill) == want
    assert want in possible_routes(has_prefill_pool)


def test_the_possible_routes_are_each_decision_and_reason_once() -> None:
    assert possible_routes(False) == [("local", "no_prefill_pool")]
    with_pool = possible_routes(True)
    assert len(set(with_pool)) == len(with_pool) == 5
    assert ("local", "no_prefill_pool") not in with_pool
