"""Placement in a pool from the replicas' KV events and load, without Ray: overlap against load,
ties, a burst's stickiness, gaps, stale and restarted replicas."""

import collections
import itertools

import pytest

from pdserve.engine.kv_events import KVEventLog
from pdserve.engine.prefix_hash import extend_block_hashes
from pdserve.engine.sampling_params import SamplingParams
from pdserve.router.dispatch.placement import (
    FORGET_S,
    HOT_S,
    RECENT_S,
    RESERVED_S,
    STALE_S,
    PoolPlacement,
)
from pdserve.serving.messages import GenerateRequest

BLOCK = 16
CAPACITY = 100  # blocks, each replica's
_REPORT_SEQ = itertools.count()  # a report's number: one count for all, so each is new


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _request(tokens: list[int], request_id: str = "r") -> GenerateRequest:
    hashes: list[bytes] = []
    extend_block_hashes(hashes, tokens, BLOCK)
    return GenerateRequest(request_id, tokens, SamplingParams(), 0, tuple(hashes))


def _caching(log: KVEventLog, request: GenerateRequest, blocks: int | None = None) -> None:
    for block_hash in request.block_hashes[:blocks]:
        log.stored(block_hash)


def _stats(
    log: KVEventLog, at: float, held_blocks: int = 0, queued: int = 0, running: int = 0
) -> dict:
    """A new report, made at ``at`` on a clock this test shares with the router."""
    return {
        "kv_events": log.report(),
        "report_seq": next(_REPORT_SEQ),
        "made_at": at,
        "num_blocks": CAPACITY,
        "num_free_blocks": CAPACITY - held_blocks,
        "num_queued_prefill_tokens": queued,
        "num_running": running,
    }


@pytest.fixture
def clock() -> Clock:
    return Clock()


def test_a_cached_prefix_outweighs_a_little_load(clock: Clock) -> None:
    placement = PoolPlacement("decode", BLOCK, clock=clock)
    a, b = KVEventLog(), KVEventLog()
    request = _request(list(range(160)))  # 10 full blocks
    _caching(a, request)
    placement.sync({"a": _stats(a, clock.now, queued=40, running=3), "b": _stats(b, clock.now)})
    assert placement.place(request) == ("a", 160)


def test_load_is_the_prompt_tokens_queued_and_the_sequences_run_not_the_kv_held(
    clock: Clock,
) -> None:
    placement = PoolPlacement("decode", BLOCK, clock=clock)
    a, b = KVEventLog(), KVEventLog()
    placement.sync(
        {
            "a": _stats(a, clock.now, held_blocks=80, running=2),  # two long sequences
            "b": _stats(b, clock.now, held_blocks=4, running=3, queued=60),
        }
    )
    assert {placement.place(_request([i] * 32, f"r{i}")).replica for i in range(20)} == {"a"}


def test_a_request_sent_is_load_for_its_uncached_tokens_only(clock: Clock) -> None:
    placement = PoolPlacement("prefill", BLOCK, clock=clock)
    a, b = KVEventLog(), KVEventLog()
    cached = _request(list(range(320)), "cached")  # 20 blocks, all cached at a
    _caching(a, cached)
    placement.sync({"a": _stats(a, clock.now), "b": _stats(b, clock.now, queued=100)})
    placement.sent("a", _request(list(range(320)) + [5] * 8, "repeat"))  # 8 tokens to compute
    assert placement.view()["a"]["load_tokens"] == 8
    assert placement.place(_request([7] * 32, "other")).replica == "a"


def test_new_prefixes_spread_so_each_replica_s_working_set_fits(clock: Clock) -> None:
    # 8 tenants of 24 blocks over two replicas of 100: four each fit, five in one do not. Load is
    # nil between requests (each call ends before the next), so only the working sets tell.
    for trial in range(10):
        placement = PoolPlacement("decode", BLOCK, clock=clock)
        logs = {"a": KVEventLog(), "b": KVEventLog()}
        placement.sync({name: _stats(log, clock.now) for name, log in logs.items()})
        tenants = collections.defaultdict(list)
        for tenant in range(8):
            request = _request([100 * trial + tenant] * (24 * BLOCK), f"t{tenant}")
            chosen = placement.place(request).replica
            placement.sent(chosen, request)
            placement.ended(request.request_id)
            tenants[chosen].append(tenant)
        assert sorted(map(len, tenants.values())) == [4, 4], tenants
        assert {name: view["working_set_blocks"] for name, view in placement.view().items()} == {
            "a": 96,
            "b": 96,
        }


def test_a_cached_prefix_stays_put_when_every_working_set_is_full(clock: Clock) -> None:
    # Both replicas' working sets fill their caches, a's by a little more: what b would have to
    # push out to take the request is its whole prefix, a's cost is the overflow alone.
    placement = PoolPlacement("decode", BLOCK, clock=clock)
    a, b = KVEventLog(), KVEventLog()
    request = _request(list(range(20 * BLOCK)) + [9] * BLOCK, "repeat")
    _caching(a, request, blocks=20)
    placement.sync({"a": _stats(a, clock.now), "b": _stats(b, clock.now)})
    placement.sent("a", _request(list(range(20 * BLOCK)), "first"))
    placement.sent("a", _request([1] * (84 * BLOCK), "other-a"))
    placement.sent("b", _request([2] * (100 * BLOCK), "other-b"))
    for request_id in ("first", "other-a", "other-b"):
        placement.ended(request_id)
    assert placement.place(request) == ("a", 20 * BLOCK)


def test_a_working_set_holds_requests_sent_in_the_last_hot_s(clock: Clock) -> None:
    placement = PoolPlacement("decode", BLOCK, clock=clock)
    log = KVEventLog()
    placement.sync({"a": _stats(log, clock.now)})
    placement.sent("a", _request([1] * (60 * BLOCK), "old"))
    clock.now += HOT_S - 1
    placement.sent("a", _request([2] * (30 * BLOCK), "new"))
    placement.sync({"a": _stats(log, clock.now)})
    assert placement.view()["a"]["working_set_blocks"] == 90
    clock.now += 2
    placement.sync({"a": _stats(log, clock.now)})
    assert placement.view()["a"]["working_set_blocks"] == 30


def test_a_heavy_load_outweighs_a_short_cached_prefix(clock: Clock) -> None:
    placement = PoolPlacement("prefill", BLOCK, clock=clock)
    a, b = KVEventLog(), KVEventLog()
    request = _request(list(range(160)))
    _caching(a, request, blocks=1)
    placement.sync({"a": _stats(a, clock.now, queued=500), "b": _stats(b, clock.now)})
    assert placement.place(request) == ("b", 0)
    assert placement.place(request, candidates=["a"]) == ("a", 16)


def test_ties_go_to_any_of_the_best(clock: Clock) -> None:
    placement = PoolPlacement("decode", BLOCK, clock=clock)
    logs = {name: KVEventLog() for name in "abc"}
    placement.sync({name: _stats(log, clock.now) for name, log in logs.items()})
    chosen = collections.Counter(
        placement.place(_request([i] * 40, f"r{i}")).replica for i in range(300)
    )
    assert set(chosen) == {"a", "b", "c"} and min(chosen.values()) > 50, chosen


def test_blocks_sent_count_as_cached_before_the_replica_reports_them(clock: Clock) -> None:
    # Overlap weighs twice: the first request's queued tokens no longer cancel its prefix.
    placement = PoolPlacement("prefill", BLOCK, kv_overlap_weight=2.0, clock=clock)
    logs = {"a": KVEventLog(), "b": KVEventLog()}
    placement.sync({name: _stats(log, clock.now) for name, log in logs.items()})
    prefix = list(range(256))
    first = placement.place(_request(prefix + [1] * 8, "first"))
    placement.sent(first.replica, _request(prefix + [1] * 8, "first"))
    for i in range(5):  # no report in between: the blocks sent count as cached there
        assert placement.place(_request(prefix + [2 + i] * 8, f"r{i}")) == (first.replica, 256)
    clock.now += RECENT_S - 1  # reports made too soon after the send to have them: not heard
    placement.sync({name: _stats(log, clock.now) for name, log in logs.items()})
    assert placement.place(_request(prefix, "soon")) == (first.replica, 256)
    clock.now += 2  # a report made RECENT_S after the send, without them (never stored): its word
    placement.sync({name: _stats(log, clock.now) for name, log in logs.items()})
    assert placement.place(_request(prefix, "later"), [first.replica]).cached_tokens == 0


def test_never_reported_blocks_are_forgotten(clock: Clock) -> None:
    placement = PoolPlacement("decode", BLOCK, clock=clock)
    log = KVEventLog(window=1)
    placement.sync({"a": _stats(log, clock.now)})
    log.stored(b"elsewhere")
    log.report()  # unheard: a gap, so this router trusts no index of a until a snapshot
    placement.sync({"a": _stats(log, clock.now)})
    placement.sent("a", _request(list(range(64)), "first"))
    clock.now += FORGET_S - 1
    placement.sync({"a": _stats(log, clock.now)})
    assert placement.place(_request(list(range(64)), "again")).cached_tokens == 64
    clock.now += 2
    assert placement.place(_request(list(range(64)), "again")).cached_tokens == 0


def test_a_call_s_blocks_count_until_a_report_made_after_it_ended(clock: Clock) -> None:
    # Reports may come late (a busy controller): a prompt repeated after its call ended still
    # finds its prefix where the call left it, until the replica's own word comes.
    placement = PoolPlacement("decode", BLOCK, clock=clock)
    a, b = KVEventLog(), KVEventLog()
    placement.sync({"a": _stats(a, clock.now), "b": _stats(b, clock.now)})
    request = _request(list(range(160)), "first")
    placement.sent("a", request)
    clock.now += 20.0  # a long call; its blocks stored at a, in no report this router heard
    placement.ended("first")
    clock.now += 8.0
    placement.sync({"a": _stats(a, clock.now - 9.0), "b": _stats(b, clock.now)})  # made before
    assert placement.place(_request(list(range(160)), "again")) == ("a", 160)
    # Made after the end, but within RECENT_S of it: perhaps before the blocks were stored.
    placement.sync({"a": _stats(a, clock.now - 8.0 + RECENT_S - 1), "b": _stats(b, clock.now)})
    assert placement.place(_request(list(range(160)), "again")) == ("a", 160)
    clock.now += RECENT_S
    placement.sync({"a": _stats(a, clock.now), "b": _stats(b, clock.now)})  # later, without them
    assert placement.place(_request(list(range(160)), "again")).cached_tokens == 0
    _caching(a, request)
    placement.sync({"a": _stats(a, clock.now), "b": _stats(b, clock.now)})
    assert placement.place(_request(list(range(160)), "again")) == ("a", 160)


def test_a_call_sent_elsewhere_leaves_no_blocks_behind(clock: Clock) -> None:
    placement = PoolPlacement("decode", BLOCK, clock=clock)
    placement.sync({"a": _stats(KVEventLog(), clock.now), "b": _stats(KVEventLog(), clock.now)})
    request = _request(list(range(160)), "first")
    placement.sent("a", request)
    placement.sent("b", request)  # a rejected it
    assert placement.place(_request(list(range(160)), "again"), ["a"]).cached_tokens == 0
    assert placement.place(_request(list(range(160)), "again"), ["b"]) == ("b", 160)
    views = placement.view()  # nor in a's working set: they never reached it
    assert (views["a"]["working_set_blocks"], views["b"]["working_set_blocks"]) == (0, 10)


def test_load_sent_counts_until_a_later_report(clock: Clock) -> None:
    placement = PoolPlacement("prefill", BLOCK, clock=clock)
    a, b = KVEventLog(), KVEventLog()
    placement.sync({"a": _stats(a, clock.now), "b": _stats(b, clock.now)})
    placement.sent("a", _request(list(range(600)), "big"))
    assert {placement.place(_request([7] * 32, f"r{i}")).replica for i in range(20)} == {"b"}
    clock.now += 1.0  # a's report after the send: its load is the report's own (0)
    placement.sync({"a": _stats(a, clock.now), "b": _stats(b, clock.now, queued=100)})
    assert {placement.place(_request([7] * 32, f"s{i}")).replica for i in range(20)} == {"a"}


def test_events_keep_the_index_and_removals_drop_from_it(clock: Clock) -> None:
    placement = PoolPlacement("decode", BLOCK, clock=clock)
    log = KVEventLog()
    request = _request(list(range(64)))
    _caching(log, request)
    placement.sync({"a": _stats(log, clock.now)})
    assert placement.place(request).cached_tokens == 64
    log.removed(request.block_hashes[2])
    placement.sync({"a": _stats(log, clock.now)})
    assert placement.place(request).cached_tokens == 32  # the chain breaks at block 2
    log.cleared()
    placement.sync({"a": _stats(log, clock.now)})
    assert placement.place(request).cached_tokens == 0


def test_a_gap_in_the_events_trusts_nothing_until_a_snapshot(clock: Clock) -> None:
    placement = PoolPlacement("decode", BLOCK, clock=clock)
    log = KVEventLog(window=2, snapshot_every=6)
    request = _request(list(range(64)))
    placement.sync({"a": _stats(log, clock.now)})  # report 0 (a snapshot)
    _caching(log, request)
    for _ in range(3):  # reports 1-3, unheard: the window moves past report 1's events
        log.report()
    placement.sync({"a": _stats(log, clock.now)})  # report 4
    assert placement.place(request).cached_tokens == 0
    log.report()  # report 5, unheard
    placement.sync({"a": _stats(log, clock.now)})  # report 6: a snapshot
    assert placement.place(request).cached_tokens == 64


def test_a_silent_replica_is_not_trusted_and_a_restarted_one_starts_afresh(clock: Clock) -> None:
    placement = PoolPlacement("decode", BLOCK, clock=clock)
    log = KVEventLog()
    request = _request(list(range(64)))
    _caching(log, request)
    placement.sync({"a": _stats(log, clock.now)})
    clock.now += STALE_S + 1
    assert placement.place(request).cached_tokens == 0
    placement.sync({"a": _stats(log, clock.now)})
    assert placement.place(request).cached_tokens == 64
    placement.sync({"a": _stats(KVEventLog(), clock.now)})  # the same id, a new engine
    assert placement.place(request).cached_tokens == 0


def test_replicas_gone_are_never_chosen_and_saturation_needs_them_all(clock: Clock) -> None:
    placement = PoolPlacement("prefill", BLOCK, clock=clock)
    a, b = KVEventLog(), KVEventLog()
    placement.sync({"a": _stats(a, clock.now, queued=900), "b": _stats(b, clock.now)})
    assert not placement.saturated(800)
    placement.sync({"a": _stats(a, clock.now, queued=900)})
    assert placement.num_replicas == 1 and placement.saturated(800)
    assert {placement.place(_request([1] * 32, f"r{i}")).replica for i in range(10)} == {"a"}
    placement.sync({})
    with pytest.raises(LookupError):
        placement.place(_request([1] * 32))


def test_a_call_that_ended_is_no_longer_load(clock: Clock) -> None:
    placement = PoolPlacement("prefill", BLOCK, clock=clock)
    placement.sync({"a": _stats(KVEventLog(), clock.now), "b": _stats(KVEventLog(), clock.now)})
    big = _request(list(range(600)), "big")
    placement.sent("a", big)
    assert placement.place(_request([7] * 32, "small")).replica == "b"
    placement.ended("big")  # before any report: a short call ends well within a period
    placement.ended("never-sent")  # harmless
    placement.sent("b", _request(list(range(100)), "other"))
    assert placement.place(_request([7] * 32, "small")).replica == "a"


def test_calls_at_a_replica_that_left_the_pool_are_orphaned_until_they_end(clock: Clock) -> None:
    placement = PoolPlacement("decode", BLOCK, clock=clock)
    placement.sync({"a": _stats(KVEventLog(), clock.now), "b": _stats(KVEventLog(), clock.now)})
    placement.sent("a", _request([1] * 32, "on-a"))
    placement.sent("b", _request([2] * 32, "on-b"))
    placement.sync({"b": _stats(KVEventLog(), clock.now)})  # a is gone: dead, or stopping
    assert placement.orphaned("on-a") and not placement.orphaned("on-b")
    # Moved to b (a continuation keeps its id): no longer orphaned.
    placement.sent("b", _request([1] * 40, "on-a"))
    assert not placement.orphaned("on-a")
    placement.sync({})
    assert placement.orphaned("on-a") and placement.orphaned("on-b")
    placement.ended("on-a")
    assert not placement.orphaned("on-a") and placement.orphaned("on-b")


def test_a_burst_of_remote_prefills_spreads_over_the_decode_replicas(clock: Clock) -> None:
    # Six long prompts at once, each prefilling remotely: their decode calls are made only once
    # prefilled, so the replicas' reports show none of them; the reservations spread them.
    placement = PoolPlacement("decode", BLOCK, clock=clock)
    placement.sync({"a": _stats(KVEventLog(), clock.now), "b": _stats(KVEventLog(), clock.now)})
    placed = []
    for i in range(6):
        request = _request([100 + i] * 160, f"r{i}")
        replica = placement.place(request).replica
        placement.reserve(replica, request, load_tokens=1)
        placed.append(replica)
    assert collections.Counter(placed) == {"a": 3, "b": 3}
    clock.now += 1.0  # reports made after the placements, before any call: still reserved
    placement.sync({"a": _stats(KVEventLog(), clock.now), "b": _stats(KVEventLog(), clock.now)})
    assert {name: view["load_tokens"] for name, view in placement.view().items()} == {
        "a": 3,
        "b": 3,
    }


def test_a_reservation_ends_when_its_call_is_sent_or_ends_or_is_never_made(
    clock: Clock,
) -> None:
    placement = PoolPlacement("decode", BLOCK, clock=clock)
    placement.sync({"a": _stats(KVEventLog(), clock.now), "b": _stats(KVEventLog(), clock.now)})
    sent, failed, lost = (_request([i] * 48, name) for i, name in enumerate("sfl"))
    for request in (sent, failed, lost):
        placement.reserve("a", request, load_tokens=10)
    assert placement.view()["a"]["load_tokens"] == 30
    placement.sent("b", sent)  # routed elsewhere (its replica refused): load there instead
    placement.ended("f")  # its prefill failed: no decode call
    view = placement.view()
    assert (view["a"]["load_tokens"], view["a"]["calls_reserved"]) == (10, 1)
    assert view["b"]["load_tokens"] == 48
    clock.now += RESERVED_S + 1  # the last never made (its stream was dropped unread)
    placement.sync({"a": _stats(KVEventLog(), clock.now), "b": _stats(KVEventLog(), clock.now)})
    assert placement.view()["a"]["load_tokens"] == 0
