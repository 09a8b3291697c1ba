"""``bench serve``'s schedules: gamma arrivals keep their mean rate while ``burstiness`` sets how
clumped they are (the gaps' coefficient of variation is 1 / sqrt(burstiness)), a sweep runs one
seeded schedule per rate, and a ramp steps through its stages."""

import argparse
import math

import numpy as np
import pytest

from pdserve.benchmarks.arrivals import Stage, arrival_offsets, send_times
from pdserve.benchmarks.serve_bench.cli import add_arguments, plan_runs

NUM = 20_000
RATE = 8.0


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_arrivals_keep_the_rate_and_set_the_burstiness(burstiness: float) -> None:
    offsets = arrival_offsets(NUM, RATE, seed=0, burstiness=burstiness)
    gaps = np.diff(offsets)
    assert offsets[0] == 0 and offsets == sorted(offsets)
    assert np.mean(gaps) == pytest.approx(1 / RATE, rel=0.05)
    cv = np.std(gaps) / np.mean(gaps)
    assert cv == pytest.approx(1 / math.sqrt(burstiness), rel=0.1)


def test_arrivals_are_seeded_or_all_at_once() -> None:
    assert arrival_offsets(50, RATE, seed=1) == arrival_offsets(50, RATE, seed=1)
    assert arrival_offsets(50, RATE, seed=1) != arrival_offsets(50, RATE, seed=2)
    assert arrival_offsets(3, math.inf, seed=0) == [0.0, 0.0, 0.0]
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match="burstiness"):
            arrival_offsets(3, RATE, seed=0, burstiness=bad)


def test_a_bursty_ramp_still_steps_its_rate() -> None:
    times = send_times([Stage(2.0, 500.0), Stage(20.0, 500.0)], seed=0, burstiness=0.5)
    first = sum(t < 500 for t in times)
    assert 800 < first < 1200 and 8000 < len(times) - first < 12000  # 1,000 and 10,000


def test_a_sweep_is_one_seeded_run_per_rate() -> None:
    plans = plan_runs(_args("--request-rate", "2,4,inf", "--num-prompts", "10", "--seed", "5"))
    assert [p.label for p in plans] == ["rate 2", "rate 4", "rate inf"]
    assert [p.request_rate for p in plans] == [2.0, 4.0, math.inf]
    assert plans[0].offsets == arrival_offsets(10, 2.0, seed=5)
    assert plans[1].offsets == arrival_offsets(10, 4.0, seed=6)  # its own seed
    assert plans[2].offsets == [0.0] * 10
    with pytest.raises(ValueError, match="request rate"):
        plan_runs(_args("--request-rate", "1,0"))


def test_a_ramp_is_one_run_of_its_stages_and_concurrency_is_labelled() -> None:
    (plan,) = plan_runs(_args("--ramp", "1:30,5:10", "--seed", "2"))
    assert plan.stages == [Stage(1.0, 30.0), Stage(5.0, 10.0)] and plan.request_rate is None
    assert plan.offsets == send_times(plan.stages, seed=2)
    (capped,) = plan_runs(_args("--max-concurrency", "8", "--num-prompts", "3"))
    assert capped.label == "rate inf, concurrency 8"
