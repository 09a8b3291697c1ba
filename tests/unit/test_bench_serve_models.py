"""``bench serve --models a,b --rounds N``: models of one server compared in alternating rounds.
Every run goes to each model with the same prompts and arrivals, in the order a, b then b, a;
each round draws its own; each model's requests are summarised together, b over a."""

import argparse
import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pdserve.benchmarks.latency import TokenClock
from pdserve.benchmarks.openai_http import Usage
from pdserve.benchmarks.serve_bench import cli
from pdserve.benchmarks.serve_bench.backends import HTTPBackend
from pdserve.benchmarks.serve_bench.compare import pooled_table
from pdserve.benchmarks.serve_bench.datasets import BenchRequest


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(list(argv))


class _Recorder:
    """A backend that answers at once, with one token per request, and logs what it was sent."""

    def __init__(self, model: str, log: list[tuple[str, str]]) -> None:
        self.model, self.log = model, log

    async def send(self, request: BenchRequest, clock: TokenClock) -> Usage:
        self.log.append((self.model, request.prompt))
        clock.tick(1)
        return Usage(request.prompt_len, 1, 0 if self.model == "a" else request.prompt_len)

    def for_model(self, model: str) -> "_Recorder":
        return _Recorder(model, self.log)


def test_rounds_repeat_the_runs_each_with_its_own_seed() -> None:
    plans = cli.plan_runs(
        _args("--request-rate", "2,4", "--num-prompts", "5", "--seed", "3", "--rounds", "2")
    )
    assert [p.label for p in plans] == [
        "rate 2, round 1",
        "rate 4, round 1",
        "rate 2, round 2",
        "rate 4, round 2",
    ]
    assert [p.seed for p in plans] == [3, 4, 5, 6]
    assert plans[0].offsets != plans[2].offsets  # a round's own arrivals
    with pytest.raises(ValueError, match="rounds"):
        cli.plan_runs(_args("--rounds", "0"))


@pytest.mark.parametrize("given", ["a", "a,a", "a,"])
def test_models_are_two_or_more_distinct(given: str) -> None:
    with pytest.raises(SystemExit):
        _args("--models", given)
    with pytest.raises(SystemExit):  # one or the other
        _args("--model", "a", "--models", "a,b")


def test_every_run_goes_to_each_model_alternating_and_pools_by_model(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log: list[tuple[str, str]] = []

    @contextlib.asynccontextmanager
    async def recorder(url: str, grpc: str | None, model: str, *_: object) -> AsyncIterator:
        yield _Recorder(model, log)

    monkeypatch.setattr(cli, "open_backend", recorder)
    args = _args(
        "--url", "http://x", "--models", "a,b", "--rounds", "3", "--num-prompts", "4",
        "--request-rate", "inf", "--warmup", "1", "--tokenizer", str(tiny_model_dir),
        "--disable-tqdm",
    )  # fmt: skip
    result = asyncio.run(cli._bench(args, cli.plan_runs(args)))
    warmup, sent = log[:2], log[2:]
    assert [model for model, _ in warmup] == ["a", "b"] and warmup[0][1] == warmup[1][1]
    assert [run["model"] for run in result["runs"]] == ["a", "b", "b", "a", "a", "b"]
    runs = [sent[i * 4 : (i + 1) * 4] for i in range(6)]
    for first, second in zip(runs[::2], runs[1::2], strict=True):  # each round: the same prompts
        assert sorted(p for _, p in first) == sorted(p for _, p in second)
    assert {p for _, p in runs[0]}.isdisjoint(p for _, p in runs[2])  # each round its own
    pooled = result["pooled"]
    assert [pooled[m]["completed"] for m in ("a", "b")] == [12, 12]
    assert (pooled["a"]["prefix_cache_hit_rate"], pooled["b"]["prefix_cache_hit_rate"]) == (0, 1)
    table = pooled_table(pooled)
    assert table[0] == "| metric | a | b | b / a |"
    assert "| completed | 12 | 12 | 1.000x |" in table
    assert "| prefix_cache_hit_rate | 0.00 | 1.00 | - |" in table  # no ratio over zero


def test_a_backend_for_another_model_shares_its_connection() -> None:
    client = object()
    first = HTTPBackend(client, "a", chat=False, ignore_eos=True)  # type: ignore[arg-type]
    second = first.for_model("b")
    assert (first.model, second.model) == ("a", "b") and second.client is client
