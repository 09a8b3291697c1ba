"""No instant crosses hosts, whose clocks may differ: a replica whose clock is an hour off either
way is routed exactly as one that agrees with the router, a report that stops changing goes
stale on the router's clock, and a KV lease's handle carries the time it has left, which each
holder counts down on its own clock."""

import pickle
import time

from pdserve.engine.kv_events import KVEventLog
from pdserve.engine.prefix_hash import extend_block_hashes
from pdserve.engine.sampling_params import SamplingParams
from pdserve.kvtransfer.handles import KVExport
from pdserve.router.dispatch.placement import STALE_S, PoolPlacement
from pdserve.serving.messages import GenerateRequest
from pdserve.serving.replica import RoutingReports

BLOCK = 16
SKEWS = (-3600.0, 0.0, 3600.0)  # a replica's clock against the router's
# Times are sums of powers of two: the same instants on every clock, to the last bit.
DELIVERY_S = 0.0625  # from a report's making to the router's hearing it (Serve's controller)
SENT_AFTER_S = 0.25  # a call sent after a report was made, before the router heard that report
PERIOD_S = 0.5  # between a replica's reports
PREFIX = list(range(256))  # 16 full blocks
HELD_S = 0.05  # a KV handle held before it is sent
SLACK_S = 1.0  # this test's own time, at most, between the sleep and the reading


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _request(tokens: list[int], request_id: str) -> GenerateRequest:
    hashes: list[bytes] = []
    extend_block_hashes(hashes, tokens, BLOCK)
    return GenerateRequest(request_id, tokens, SamplingParams(), 0, tuple(hashes))


def _route(skew: float) -> list:
    """A call, the reports around it and a silence, with both replicas' clocks ``skew`` off the
    router's: what the router chose and saw at each step."""
    router = Clock(1000.0)
    placement = PoolPlacement("prefill", BLOCK, clock=router)
    logs = {"a": KVEventLog(), "b": KVEventLog()}
    reports = {name: RoutingReports(clock=lambda: router.now + skew) for name in logs}
    queued = {"a": 0, "b": 0}

    def made() -> dict[str, dict]:  # each replica's report, made now
        return {
            name: reports[name].make(
                {
                    "num_queued_prefill_tokens": queued[name],
                    "num_running": 0,
                    "num_blocks": 100,
                    "num_free_blocks": 100,
                },
                logs[name],
            )
            for name in logs
        }

    def deliver(reports: dict[str, dict]) -> None:
        router.now += DELIVERY_S
        placement.sync(reports)

    for block_hash in _request(PREFIX, "").block_hashes:
        logs["a"].stored(block_hash)
    deliver(made())
    first = _request(PREFIX + [1] * 8, "first")
    seen = [placement.place(first)]
    early = made()  # made before the call was sent, heard after
    router.now += SENT_AFTER_S
    placement.sent("a", first)
    deliver(early)
    seen.append(placement.view()["a"])
    queued["a"] = len(first.prompt_token_ids)  # the call is in a's next report
    router.now += PERIOD_S
    deliver(made())
    seen.append(placement.view()["a"])
    queued["a"], queued["b"] = 0, 8
    last = made()
    deliver(last)
    seen.append(placement.place(_request(PREFIX, "cached")))
    router.now += STALE_S  # Serve hands the same reports on: nothing new from either replica
    placement.sync(last)
    seen.append(placement.place(_request(PREFIX, "after-silence")))
    return seen


def test_a_replica_clock_an_hour_off_routes_as_one_that_agrees() -> None:
    runs = [_route(skew) for skew in SKEWS]
    assert runs[0] == runs[1] == runs[2]
    first, after_send, after_report, cached, after_silence = runs[1]
    assert first == ("a", 256)
    # A report made before the send leaves the call as load there (its 8 tokens not cached at
    # a), one made after counts it (as the replica sees it: the whole prompt queued).
    assert after_send["load_tokens"] == 8 and after_send["calls_in_flight"] == 1
    assert after_report["load_tokens"] == 264 and after_report["calls_in_flight"] == 0
    assert cached == ("a", 256)
    # Silent for STALE_S on the router's clock, even when a's clock is an hour ahead.
    assert after_silence == ("a", 0)


def test_a_kv_lease_crosses_processes_as_the_time_it_has_left() -> None:
    export = KVExport("owner", (1, 2), "owner:0", lease_seconds=30.0)
    time.sleep(HELD_S)  # held at the owner, then sent
    _, wire = export.__reduce__()
    # What travels: the fields and the time left, no instant of the owner's clock.
    assert wire[:3] == ("owner", (1, 2), "owner:0") and wire[4] is None
    assert 30.0 - HELD_S - SLACK_S < wire[3] <= 30.0 - HELD_S
    arrived = pickle.loads(pickle.dumps(export))
    # The receiver counts that down from the arrival, on its own clock.
    assert arrived.since >= export.since + HELD_S
    assert arrived.time_left() <= arrived.lease_seconds <= 30.0 - HELD_S
