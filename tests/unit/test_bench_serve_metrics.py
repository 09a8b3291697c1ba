"""``bench serve``'s metrics on hand-made timings, by vLLM's definitions: TPOT per request from its
E2EL and TTFT, ITL over every gap, throughputs over the run, goodput as the requests meeting every
SLO; failed requests counted with their errors and kept out of the latencies."""

import pytest

from pdserve.benchmarks import latency
from pdserve.benchmarks.latency import TokenClock
from pdserve.benchmarks.serve_bench.metrics import Record, parse_slos, summarize

SECONDS = 2.0
# 5 tokens: TTFT 100 ms, gaps 10, 10, 30, 30 ms, stream over at 200 ms -> TPOT 25 ms, ITL mean 20
SLOW = Record(0.0, 10, 5, 4, 5, 0.1, [0.01, 0.01, 0.03, 0.03], 0.2, None)
# 3 tokens: TTFT 50 ms, gaps 5, 5 ms, over at 70 ms -> TPOT 10 ms, ITL mean 5
FAST = Record(0.5, 20, 3, None, 3, 0.05, [0.005, 0.005], 0.07, None)
ONE_TOKEN = Record(1.0, 30, 1, 30, 1, 0.3, [], 0.3, None)  # no TPOT, no ITL
FAILED = Record(1.5, 40, 0, None, 8, None, [], 0.01, "OpenAIError: HTTP 503: overloaded")


def test_a_chunk_of_k_tokens_adds_k_even_gaps(monkeypatch: pytest.MonkeyPatch) -> None:
    times = iter([10.0, 10.1, 10.3, 10.4])
    monkeypatch.setattr(latency.time, "perf_counter", lambda: next(times))
    clock = TokenClock()  # sent at 10.0
    clock.tick(2)  # first chunk, 2 tokens: TTFT, and the second token arrives with it: gap 0
    clock.tick(0)  # a finish-only chunk: nothing
    clock.tick(4)  # 4 tokens 200 ms later: 4 gaps of 50 ms
    clock.tick(1)
    assert clock.ttft == pytest.approx(0.1) and clock.num_tokens == 7
    assert clock.itls == pytest.approx([0.0] + [0.05] * 4 + [0.1])  # one gap per later token


def test_latencies_by_vllm_definitions() -> None:
    assert SLOW.latency_s("tpot") == pytest.approx(0.025)  # (200 - 100) / (5 - 1)
    assert SLOW.latency_s("itl") == pytest.approx(0.02)
    assert ONE_TOKEN.latency_s("tpot") is None and ONE_TOKEN.latency_s("itl") is None
    summary = summarize([SLOW, FAST, ONE_TOKEN, FAILED], SECONDS, {})
    assert summary["completed"] == 3 and summary["failed"] == 1
    assert summary["errors"] == {FAILED.error: 1}
    # cached over prompt tokens where the server said: (4 + 30) / (10 + 30); FAST did not say
    assert summary["prefix_cache_hit_rate"] == pytest.approx(0.85)
    assert summary["mean_ttft_ms"] == pytest.approx(150.0)  # 100, 50, 300: the failure left out
    assert summary["p50_ttft_ms"] == pytest.approx(100.0)
    assert summary["mean_tpot_ms"] == pytest.approx(17.5)  # 25 and 10
    assert summary["mean_itl_ms"] == pytest.approx(15.0)  # every gap: 10 10 30 30 5 5
    assert summary["p90_itl_ms"] == pytest.approx(30.0)
    assert summary["p50_e2el_ms"] == pytest.approx(200.0)  # 200, 70, 300
    assert summary["total_input_tokens"] == 60 and summary["total_output_tokens"] == 9
    assert summary["request_throughput"] == pytest.approx(1.5)
    assert summary["output_throughput"] == pytest.approx(4.5)
    assert summary["total_token_throughput"] == pytest.approx(34.5)
    assert summary["goodput"] is None  # no SLO given


@pytest.mark.parametrize(
    ("slo", "meeting"),
    [
        ("ttft=100", 2),  # SLOW (100 = the SLO) and FAST; ONE_TOKEN's 300 misses
        ("ttft=99", 1),
        ("tpot=20", 2),  # FAST, and ONE_TOKEN, which has no TPOT
        ("itl=20", 3),  # the per-request mean: SLOW's 20 meets it though two gaps are 30
        ("itl=19,e2el=250", 1),  # FAST only: ONE_TOKEN meets the ITL but not E2EL 300 ms
        ("ttft=1000,tpot=1000,itl=1000,e2el=1000", 3),  # never the failed one
    ],
)
def test_goodput_counts_requests_meeting_every_slo(slo: str, meeting: int) -> None:
    summary = summarize([SLOW, FAST, ONE_TOKEN, FAILED], SECONDS, parse_slos(slo))
    assert summary["goodput"] == pytest.approx(meeting / SECONDS)


def test_slos_parse_and_refuse_nonsense() -> None:
    assert parse_slos("ttft=200,itl=50.5") == {"ttft": 200.0, "itl": 50.5}
    assert parse_slos(None) == {} == parse_slos("")
    for bad in ("ttft", "latency=3", "ttft=0", "itl=-1"):
        with pytest.raises(ValueError, match="SLO"):
            parse_slos(bad)


def test_a_request_row_holds_its_latencies_in_ms() -> None:
    row = SLOW.row()
    assert row["ttft_ms"] == pytest.approx(100) and row["tpot_ms"] == pytest.approx(25)
    assert row["itls_ms"] == pytest.approx([10, 10, 30, 30]) and row["error"] is None
    assert FAILED.row()["tpot_ms"] is None and FAILED.row()["error"] == FAILED.error
