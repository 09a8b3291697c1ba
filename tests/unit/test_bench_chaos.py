"""``bench chaos``'s parts that need no server: the kill schedule (round robin, before the run's
end), where clients abandon streams, and the report: streams' endings, a row per replica seen
(a killed one and its successor apart), and what fails the run."""

import asyncio
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest

from pdserve.benchmarks.chaos_kills import Kill, kill_plan, parse_roles
from pdserve.benchmarks.chaos_load import Outcome, abandon_point, send
from pdserve.benchmarks.chaos_report import print_report, problems, replica_rows, summarize
from pdserve.benchmarks.serve_bench.datasets import BenchRequest

MIB = 2**20
DECODE, PREFILL = "decode-m", "prefill-m"


def _stats(replica: str, free: int, total: int = 64, rss_mib: int = 100) -> dict:
    return {
        "replica": replica,
        "num_free_blocks": free,
        "num_blocks": total,
        "rss_bytes": rss_mib * MIB,
    }


class _Chunks:
    """A server's stream as the client reads it: chunks of these many tokens each."""

    def __init__(self, *sizes: int) -> None:
        self.sizes = sizes

    async def events(self, path: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        for size in self.sizes:
            yield {"choices": [{"logprobs": {"tokens": ["t"] * size}}]}


def test_a_chunk_that_brings_the_last_token_ends_the_stream_whole() -> None:
    request = BenchRequest("a prompt", 3, 24)
    # Under load the engine sends tokens in fewer chunks: 20, then the last 4 at once.
    whole = asyncio.run(send(_Chunks(20, 4), "m", request, abandon_after=22))
    assert whole == Outcome("completed", 24, 24, None)
    left = asyncio.run(send(_Chunks(20, 4), "m", request, abandon_after=19))
    assert left == Outcome("abandoned", 20, 24, None)


def test_kills_take_the_roles_in_turn_strictly_before_the_end() -> None:
    assert parse_roles("decode,prefill") == ["decode", "prefill"]
    assert parse_roles(" decode ") == ["decode"] and parse_roles("") == []
    with pytest.raises(ValueError, match="router"):
        parse_roles("decode,router")
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
        Outcome("completed", 8, 8, None),
        Outcome("completed", 8, 8, None),
        Outcome("abandoned", 3, 8, None),
        Outcome("refused", 0, 8, "HTTP 429: too many"),
        Outcome("failed", 5, 8, "wrong length"),
    ]
    summary = summarize(outcomes)
    assert summary == {
        "started": 5,
        "completed": 2,
        "abandoned": 1,
        "refused": 1,
        "failed": 1,
        "errors": {"wrong length": 1},
        "refusals": {"HTTP 429: too many": 1},
    }


def test_a_killed_replica_and_its_successor_are_rows_apart() -> None:
    start = {DECODE: {"a": _stats("a", 64), "b": _stats("b", 64)}, PREFILL: {"p": _stats("p", 64)}}
    end = {DECODE: {"b": _stats("b", 64, rss_mib=120), "c": _stats("c", 64)}, PREFILL: {}}
    rows = replica_rows(start, end, [Kill(10.0, DECODE, "a", 2), Kill(20.0, PREFILL, "p", 1)])
    by_id = {row["replica"]: row for row in rows}
    assert list(by_id) == ["a", "b", "c", "p"]
    assert by_id["a"]["killed"] and not by_id["a"]["live_at_end"]
    assert by_id["b"]["rss_start_bytes"] == 100 * MIB and by_id["b"]["rss_end_bytes"] == 120 * MIB
    assert by_id["c"]["rss_start_bytes"] is None and by_id["c"]["free_blocks"] == 64
    summary = summarize([Outcome("completed", 8, 8, None)])
    assert problems(summary, rows) == []


def test_held_blocks_a_silent_replica_or_a_failed_stream_fail_the_run(
    capsys: pytest.CaptureFixture,
) -> None:
    end = {DECODE: {"b": _stats("b", 60), "c": None}}
    rows = replica_rows({DECODE: {"b": _stats("b", 64)}}, end, [])
    summary = summarize([Outcome("failed", 0, 8, "ClientPayloadError: cut")])
    found = problems(summary, rows)
    assert found == [
        "1 accepted streams failed",
        f"{DECODE} replica b: 60 of 64 KV blocks free",
        f"{DECODE} replica c did not answer at the end",
    ]
    config = {"streams": 2, "kill_every": 5.0, "kill": "", "disconnect_fraction": 0.0}
    result = {"model": "m", "config": config, "seconds": 9.6, "summary": summary}
    result |= {"migrated": 0, "kills": [], "replicas": rows, "problems": found}
    print_report(result)
    printed = capsys.readouterr().out
    assert "| 1 | 0 | 0 | 0 | 1 | 0 | 0 |" in printed
    assert "failed (1): ClientPayloadError: cut" in printed
    assert f"| {DECODE} | b | 60 / 64 | 100 | 100 |" in printed
    assert f"| {DECODE} | c | no answer | - | - |" in printed
    assert f"FAILED: {DECODE} replica b: 60 of 64 KV blocks free" in printed
