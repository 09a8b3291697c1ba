"""``bench chaos``'s parts that need no server: the kill schedule (round robin, before the run's
end), where clients abandon streams, which failed streams a router kill cut, and the report:
streams' endings, a row per replica seen (a killed one and its successor apart), and what fails
the run."""

import asyncio
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest

from pdserve.benchmarks.chaos_kills import Kill, kill_plan, parse_roles
from pdserve.benchmarks.chaos_load import Outcome, abandon_point, cut_by_router_kills, send
from pdserve.benchmarks.chaos_report import print_report, problems, replica_rows, summarize
from pdserve.benchmarks.serve_bench.datasets import BenchRequest

MIB = 2**20
DECODE, PREFILL, ROUTER = "decode-m", "prefill-m", "router"


def _outcome(
    ending: str, tokens: int, error: str | None = None, span: tuple[float, float] = (0.0, 1.0)
) -> Outcome:
    return Outcome(ending, tokens, 8, error, "a prompt", tuple(range(tokens)), span)


def _stats(replica: str, free: int, total: int = 64, rss_mib: int = 100, **failures: int) -> dict:
    return {
        "replica": replica,
        "num_free_blocks": free,
        "num_blocks": total,
        "rss_bytes": rss_mib * MIB,
        "kv_failures": failures,
    }


class _Chunks:
    """A server's stream as the client reads it: chunks of these many tokens each."""

    def __init__(self, *sizes: int) -> None:
        self.sizes = sizes

    async def events(self, path: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        sent = 0
        for size in self.sizes:
            tokens = [f"token_id:{i}" for i in range(sent, sent + size)]
            sent += size
            yield {"choices": [{"logprobs": {"tokens": tokens}}]}


def test_a_chunk_that_brings_the_last_token_ends_the_stream_whole() -> None:
    request = BenchRequest("a prompt", 3, 24)
    # Under load the engine sends tokens in fewer chunks: 20, then the last 4 at once.
    whole = asyncio.run(send(_Chunks(20, 4), "m", request, abandon_after=22))
    assert whole[:5] == ("completed", 24, 24, None, "a prompt")
    assert whole.token_ids == tuple(range(24)) and whole.span[0] <= whole.span[1]
    left = asyncio.run(send(_Chunks(20, 4), "m", request, abandon_after=19))
    assert left[:4] == ("abandoned", 20, 24, None) and left.token_ids == tuple(range(20))


def test_kills_take_the_roles_in_turn_strictly_before_the_end() -> None:
    assert parse_roles("decode,prefill,router") == ["decode", "prefill", "router"]
    assert parse_roles(" decode ") == ["decode"] and parse_roles("") == []
    with pytest.raises(ValueError, match="planner"):
        parse_roles("decode,planner")
    plan = kill_plan(["decode", "prefill"], every_s=10.0, seconds=45.0)
    assert plan == [(10.0, "decode"), (20.0, "prefill"), (30.0, "decode"), (40.0, "prefill")]
    assert [role for _, role in kill_plan(["decode"], 10.0, 40.0)] == ["decode"] * 3
    assert kill_plan([], 10.0, 45.0) == [] and kill_plan(["decode"], 10.0, 10.0) == []
    with pytest.raises(ValueError, match="--kill-every"):
        kill_plan(["decode"], 0.0, 45.0)


def test_a_client_abandons_the_fraction_asked_mid_stream() -> None:
    rng = random.Random(0)
    points = [abandon_point(rng, 8, 0.25) for _ in range(4000)]
    abandoned = [p for p in points if p is not None]
    assert len(abandoned) == pytest.approx(1000, rel=0.1)
    assert set(abandoned) == set(range(1, 8))  # at least one token, never all eight
    assert abandon_point(rng, 1, 1.0) is None  # one token: no middle to leave in
    assert all(abandon_point(rng, 8, 0.0) is None for _ in range(100))


def test_the_summary_counts_each_ending_and_its_errors() -> None:
    outcomes = [
        _outcome("completed", 8),
        _outcome("completed", 8),
        _outcome("abandoned", 3),
        _outcome("refused", 0, "HTTP 429: too many"),
        _outcome("cut", 2, "ClientPayloadError: cut"),
        _outcome("failed", 5, "wrong length"),
    ]
    summary = summarize(outcomes)
    assert summary == {
        "started": 6,
        "completed": 2,
        "abandoned": 1,
        "refused": 1,
        "cut": 1,
        "failed": 1,
        "errors": {"wrong length": 1},
        "cuts": {"ClientPayloadError: cut": 1},
        "refusals": {"HTTP 429: too many": 1},
    }


def test_a_failed_stream_under_way_at_a_router_kill_is_cut_and_no_other() -> None:
    error = "ClientPayloadError: cut"
    outcomes = [
        _outcome("failed", 2, error, span=(1.0, 5.0)),  # under way at the kill
        _outcome("failed", 2, error, span=(2.95, 5.0)),  # sent while its replica was counted
        _outcome("failed", 2, error, span=(6.0, 9.0)),  # sent after it
        _outcome("completed", 8, span=(1.0, 5.0)),  # a router kill leaves it be
    ]
    cut, uncounted = cut_by_router_kills(outcomes, [(2.9, 3.0)])
    assert [o.ending for o in cut] == ["cut", "cut", "failed", "completed"] and uncounted == 1
    cut, uncounted = cut_by_router_kills(outcomes, [])
    assert [o.ending for o in cut] == ["failed", "failed", "failed", "completed"]
    assert uncounted == 0


def test_more_cuts_than_the_killed_routers_carried_or_a_greedy_difference_fail_the_run() -> None:
    rows = replica_rows({}, {}, [])
    summary = summarize([_outcome("cut", 2, "cut"), _outcome("cut", 1, "cut")])
    kills = [Kill(3.0, ROUTER, "r", 2, 2.9), Kill(6.0, DECODE, "d", 5, 5.9)]
    assert problems(summary, rows, kills, {"checked": 4, "differ": 0}) == []
    assert problems(summary, rows, [kills[0], Kill(9.0, ROUTER, None, 0, 8.9)], None) == []
    # One of the two sent while the replica's requests were counted: its count could not hold it.
    late = summary | {"cut_sent_during_a_kill": 1}
    assert problems(late, rows, [Kill(3.0, ROUTER, "r", 1, 2.9)], None) == []
    found = problems(
        summary, rows, [Kill(3.0, ROUTER, "r", 1, 2.9), kills[1]], {"checked": 4, "differ": 1}
    )
    assert found == [
        "2 streams cut by router kills, more than the killed router replicas carried (1)",
        "1 of 4 completed streams differ offline",
    ]


def test_a_killed_replica_and_its_successor_are_rows_apart() -> None:
    start = {DECODE: {"a": _stats("a", 64), "b": _stats("b", 64)}, PREFILL: {"p": _stats("p", 64)}}
    end = {DECODE: {"b": _stats("b", 64, rss_mib=120), "c": _stats("c", 64)}, PREFILL: {}}
    kills = [Kill(10.0, DECODE, "a", 2, 9.9), Kill(20.0, PREFILL, "p", 1, 19.9)]
    rows = replica_rows(start, end, kills)
    by_id = {row["replica"]: row for row in rows}
    assert list(by_id) == ["a", "b", "c", "p"]
    assert by_id["a"]["killed"] and not by_id["a"]["live_at_end"]
    assert by_id["b"]["rss_start_bytes"] == 100 * MIB and by_id["b"]["rss_end_bytes"] == 120 * MIB
    assert by_id["c"]["rss_start_bytes"] is None and by_id["c"]["free_blocks"] == 64
    summary = summarize([_outcome("completed", 8)])
    assert problems(summary, rows, [], None) == []


def test_held_blocks_a_silent_replica_or_a_failed_stream_fail_the_run(
    capsys: pytest.CaptureFixture,
) -> None:
    end = {DECODE: {"b": _stats("b", 60, checksum=3, timeout=1), "c": None}}
    rows = replica_rows({DECODE: {"b": _stats("b", 64)}}, end, [])
    summary = summarize([_outcome("failed", 0, "ClientPayloadError: cut")])
    found = problems(summary, rows, [], None)
    assert found == [
        "1 accepted streams failed",
        f"{DECODE} replica b: 60 of 64 KV blocks free",
        f"{DECODE} replica c did not answer at the end",
    ]
    config = {"streams": 2, "kill_every": 5.0, "kill": "", "disconnect_fraction": 0.0}
    result = {"model": "m", "config": config, "seconds": 9.6, "summary": summary}
    result |= {"migrated": 0, "kills": [], "greedy": {"checked": 0, "differ": 0}}
    print_report(result | {"replicas": rows, "problems": found})
    printed = capsys.readouterr().out
    assert "| 1 | 0 | 0 | 0 | 0 | 1 | 0 | 0 |" in printed
    assert "greedy check: 0 of 0 completed streams differ" in printed
    assert (
        "KV transfers failed and recomputed (replicas live at the end): checksum 3, timeout 1"
        in (printed)
    )
    assert "failed (1): ClientPayloadError: cut" in printed
    assert f"| {DECODE} | b | 60 / 64 | 100 | 100 |" in printed
    assert f"| {DECODE} | c | no answer | - | - |" in printed
    assert f"FAILED: {DECODE} replica b: 60 of 64 KV blocks free" in printed
