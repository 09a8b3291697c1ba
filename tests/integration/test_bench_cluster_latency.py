"""The cluster-latency benchmark, end to end at a tiny size, as a user runs it against a running
cluster (the session's): the workload it reports is the one asked for, the disaggregated run sends
the long prompts remote, and every table's figures hold together."""

import math
import subprocess
import sys
from pathlib import Path

import pytest

from pdserve.benchmarks.arrivals import arrival_offsets
from pdserve.benchmarks.latency import TokenClock
from pdserve.benchmarks.workload import FULL, make_workload
from pdserve.engine.config import ModelConfig
from pdserve.serving.config import DEFAULT_LOCAL_PREFILL_MAX_TOKENS

NUM_REQUESTS, MAX_OUTPUT_LEN = 4, 4

ROWS = ("offline", "aggregated", "disaggregated")


def test_a_chunk_of_k_tokens_adds_k_even_gaps_and_the_first_chunk_zeros() -> None:
    clock = TokenClock()
    clock.tick(2)  # the first token, and one more that came with it
    clock.tick(0)  # a chunk with no token (e.g. the finish reason alone) adds nothing
    clock.tick(3)
    timing = clock.timing(5)
    assert timing.num_tokens == 5 and timing.ttft > 0
    assert timing.itls[0] == 0.0  # the second token came with the first
    assert len(timing.itls) == 4 and len(set(timing.itls[1:])) == 1 and timing.itls[1] > 0
    with pytest.raises(RuntimeError, match="asked for 6 tokens, got 5"):
        clock.timing(6)


def test_arrivals_are_seeded_poisson_or_all_at_once() -> None:
    offsets = arrival_offsets(64, 8.0, seed=0)
    assert offsets == arrival_offsets(64, 8.0, seed=0) and offsets[0] == 0
    assert offsets == sorted(offsets) and 4 < offsets[-1] < 16  # ~63 / 8 s
    assert arrival_offsets(3, math.inf, seed=0) == [0.0, 0.0, 0.0]


@pytest.mark.slow  # the app deployed twice
def test_every_run_reports_its_workload_and_consistent_figures(
    ray_cluster, tiny_model_dir: Path
) -> None:
    pdserve = Path(sys.executable).with_name("pdserve")
    argv = ["--model", str(tiny_model_dir), "--num-requests", str(NUM_REQUESTS)]
    argv += ["--max-output-len", str(MAX_OUTPUT_LEN)]
    argv += ["--request-rate", "inf", "--warmup", "1", "--overhead-requests", "4"]
    argv += ["--address", ray_cluster.address, "--http-port", str(ray_cluster.http_port)]
    argv += ["--grpc-port", str(ray_cluster.grpc_port)]
    run = subprocess.run(
        [str(pdserve), "bench", "cluster-latency", *argv], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    rows = {}  # first cell -> the others, for every table row
    for line in run.stdout.splitlines():
        if line.startswith("| "):
            name, *cells = (cell.strip() for cell in line.strip("|").split("|"))
            rows[name] = cells
    # The workload as the bench makes it: its requests, output tokens and remote prefills.
    vocab = ModelConfig.from_pretrained(tiny_model_dir).vocab_size
    output_len = (FULL.output_len[0], MAX_OUTPUT_LEN)
    shape = FULL._replace(num_requests=NUM_REQUESTS, output_len=output_len)
    workload = make_workload(vocab, shape)
    outputs = sum(w.output_len for w in workload)
    assert f"{NUM_REQUESTS} requests, all at once;" in run.stdout
    assert f"{outputs} in all" in run.stdout
    remote = sum(len(w.prompt) >= DEFAULT_LOCAL_PREFILL_MAX_TOKENS for w in workload)
    assert f"{remote} of {NUM_REQUESTS} prefilled remotely" in run.stdout
    base_ttft, base_itl, base_rate = (float(rows["offline"][i]) for i in (0, 2, 4))
    for name in ROWS:
        ttft50, ttft99, itl50, itl99, rate, *ratios = (
            float(cell.removesuffix("x")) for cell in rows[name]
        )
        assert 0 < ttft50 <= ttft99 and 0 < itl50 <= itl99 and rate > 0, name
        # The ratio columns are the run's figures over the offline engine's (rounded to 0.01).
        want = (ttft50 / base_ttft, itl50 / base_itl, rate / base_rate)
        assert all(abs(r - w) <= 0.01 + 0.02 * w for r, w in zip(ratios, want, strict=True)), name
    # The TTFT taken apart: every part a finite p50 and p99; the router's share is positive (the
    # other differences, of two processes' spans, need not be).
    prefixes = (
        "TTFT ",
        "cluster's",
        "HTTP proxy",
        "for scale",
        "router's",
        "Serve call",
        "replica's",
    )
    parts = [name for name in rows if name.startswith(prefixes)]
    assert len(parts) == 8, parts
    for name in parts:
        assert len(rows[name]) == 2 and all(math.isfinite(float(c)) for c in rows[name]), name
    [router] = [rows[name] for name in parts if name.startswith("router's own share")]
    assert all(float(cell) > 0 for cell in router)
