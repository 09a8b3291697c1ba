"""The ramp benchmark's schedule and windows (its run against a server is in docs/benchmarks.md)."""

import argparse

import pytest

from pdserve.benchmarks import ramp
from pdserve.benchmarks.arrivals import Stage, parse_stages, send_times
from pdserve.benchmarks.latency import Timing
from pdserve.benchmarks.ramp import Sent, windows
from pdserve.benchmarks.serve_bench import cli as serve_bench


def test_stages_parse_and_refuse_nonsense() -> None:
    assert parse_stages("1:30,6:45.5") == [Stage(1.0, 30.0), Stage(6.0, 45.5)]
    for bad in ("0:30", "2:-1", "2"):
        with pytest.raises(ValueError):
            parse_stages(bad)


def test_send_times_step_their_rate_with_the_stages() -> None:
    stages = [Stage(2.0, 200.0), Stage(20.0, 200.0)]
    times = send_times(stages, seed=0)
    assert times == sorted(times) and times == send_times(stages, seed=0)
    first = sum(t < 200 for t in times)
    second = len(times) - first
    assert 320 < first < 480 and 3600 < second < 4400  # 400 and 4000 expected
    assert times[0] > 0 and times[-1] < 400


def test_windows_count_what_was_sent_in_them_and_its_p95() -> None:
    timing = Timing(ttft=0.1, itls=[0.01, 0.03], num_tokens=3)
    sent = [Sent(0.5, timing, None), Sent(1.5, timing, None), Sent(12.0, None, "refused")]
    rows = windows(sent, seconds=20.0, window_s=10.0)
    assert [(r["start_s"], r["sent"], r["rate"]) for r in rows] == [(0.0, 2, 0.2), (10.0, 1, 0.1)]
    assert rows[0]["ttft_p95_ms"] == pytest.approx(100.0)
    assert rows[0]["itl_p95_ms"] == pytest.approx(30.0)  # p95 of 10, 10, 30, 30 ms
    assert rows[1]["ttft_p95_ms"] is None and rows[1]["itl_p95_ms"] is None


def test_ramp_names_the_request_shape_as_bench_serve_does() -> None:
    argv = ["--input-len", "32", "--output-len", "8"]
    for module in (ramp, serve_bench):
        parser = argparse.ArgumentParser()
        module.add_arguments(parser)
        args = parser.parse_args(argv)
        assert (args.input_len, args.output_len) == (32, 8), module.__name__
