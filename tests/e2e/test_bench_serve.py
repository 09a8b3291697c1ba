"""``pdserve bench serve`` end to end, as a user runs it, against the local HTTP and gRPC servers
of the tiny model: every request sent, each output exactly as long as asked, prompts exactly the
lengths drawn (so their text encodes back to the drawn ids), the JSON's fields and the PNGs.
Counts and lengths only: the times of a busy 2-core machine prove nothing."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pdserve.cluster.cli import main

MODEL, OVERLOADED_MODEL = "tiny", "tiny-overloaded"  # as the servers (conftest.py) name them
API_KEY = "sk-test-first-key"  # one of the keys keyed_http_url asks for (conftest's API_KEYS)
NUM_PROMPTS = 4
INPUT_LEN, OUTPUT_LEN = 24, 6
PREFIX_LEN, SUFFIX_LEN = 32, 8
BOS = 1  # the tiny tokenizer's, which the server adds to a text prompt
# `pip install .` without the dev extras: neither the openai SDK nor matplotlib imports.
WITHOUT_DEV_EXTRAS = (
    "import sys; sys.modules['openai'] = sys.modules['matplotlib'] = None; "
    "from pdserve.cluster.cli import main; raise SystemExit(main(sys.argv[1:]))"
)
QUIET = ["--disable-tqdm", "--num-prompts", str(NUM_PROMPTS), "--output-len", str(OUTPUT_LEN)]


def bench(out: Path, *argv: str) -> tuple[int, dict]:
    code = main(["bench", "serve", *QUIET, "--out", str(out), *argv])
    return code, json.loads(out.read_text())


def completed_exactly(run: dict, prompt_tokens: int) -> None:
    assert run["summary"]["completed"] == NUM_PROMPTS and run["summary"]["failed"] == 0
    assert len(run["requests"]) == NUM_PROMPTS
    for request in run["requests"]:
        assert request["error"] is None
        assert request["output_tokens"] == request["max_tokens"] == OUTPUT_LEN
        assert request["prompt_tokens"] == prompt_tokens
        assert len(request["itls_ms"]) == OUTPUT_LEN - 1
        assert request["ttft_ms"] <= request["e2el_ms"]
    summary = run["summary"]
    assert summary["total_output_tokens"] == NUM_PROMPTS * OUTPUT_LEN
    assert summary["total_input_tokens"] == NUM_PROMPTS * prompt_tokens


def test_a_rate_sweep_over_http_with_slos(
    http_url: str, tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "sweep.json"
    code, result = bench(
        out,
        *("--url", http_url, "--tokenizer", str(tiny_model_dir), "--input-len", str(INPUT_LEN)),
        *("--request-rate", "20,50", "--slo", "ttft=60000,itl=60000", "--burstiness", "0.5"),
    )
    assert code == 0
    assert result["model"] == MODEL  # the server's first, as none was named
    assert [run["label"] for run in result["runs"]] == ["rate 20", "rate 50"]
    for run in result["runs"]:
        completed_exactly(run, INPUT_LEN + BOS)
        # SLOs no request misses on any machine: goodput is every completed request
        assert run["summary"]["goodput"] == pytest.approx(run["summary"]["request_throughput"])
    for suffix in ("cdf", "timeline", "rates"):
        assert out.with_suffix(f".{suffix}.png").stat().st_size > 0
    printed = capsys.readouterr().out
    assert "| metric | rate 20 | rate 50 |" in printed and "| goodput |" in printed

    plots = tmp_path / "compared.json"
    code = main(["bench", "serve", "--compare", str(out), str(out), "--out", str(plots)])
    assert code == 0
    table = capsys.readouterr().out
    assert f"| rate 20 | completed | {NUM_PROMPTS} | {NUM_PROMPTS} | 1.000x |" in table
    for suffix in ("cdf", "rates"):  # both results on the same axes, "a sweep" and "b sweep"
        assert f"plotted {plots.with_suffix(f'.{suffix}.png')}" in table
        assert plots.with_suffix(f".{suffix}.png").stat().st_size > 0
    assert not plots.exists()  # a comparison writes no result


def test_prefix_shared_over_grpc_under_a_concurrency_limit(
    grpc_address: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    code, result = bench(
        tmp_path / "grpc.json",
        *("--grpc", grpc_address, "--tokenizer", str(tiny_model_dir)),
        *("--dataset", "prefix-shared", "--num-tenants", "2", "--prefix-len", str(PREFIX_LEN)),
        *("--suffix-len", str(SUFFIX_LEN), "--max-concurrency", "2"),
        # Seed 1 orders the tenants A, B, A, B: each tenant's second request is sent only once a
        # first one has finished, so after both first prompts were prefilled. (Seed 0's A, A, B, B
        # sends a tenant's two requests together, and whether the second finds the first's blocks
        # depends on whether they land in one engine step.)
        *("--seed", "1"),
    )
    assert code == 0
    assert result["model"] == MODEL and result["backend"] == f"grpc {grpc_address}"
    (run,) = result["runs"]
    completed_exactly(run, PREFIX_LEN + SUFFIX_LEN + BOS)
    assert run["summary"]["goodput"] is None  # no SLO given
    # The tenants' later requests find their prefix cached, as the server's usage says.
    cached = [row["cached_tokens"] for row in run["requests"]]
    assert all(0 <= c <= PREFIX_LEN + SUFFIX_LEN + BOS for c in cached) and max(cached) > 0
    assert run["summary"]["prefix_cache_hit_rate"] > 0


def test_the_chat_set_over_chat_completions(
    http_url: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    code, result = bench(
        tmp_path / "chat.json",
        *("--url", http_url, "--model", MODEL, "--tokenizer", str(tiny_model_dir)),
        *("--dataset", "chat", "--request-rate", "inf", "--warmup", "0"),
    )
    assert code == 0 and result["backend"].endswith(" chat")
    (run,) = result["runs"]
    assert run["summary"]["completed"] == NUM_PROMPTS
    for request in run["requests"]:  # the set's own output lengths, each exactly
        assert request["output_tokens"] == request["max_tokens"] > 0


def test_failed_requests_are_counted_with_their_errors(
    http_url: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    code, result = bench(
        tmp_path / "refused.json",
        *("--url", http_url, "--model", OVERLOADED_MODEL, "--tokenizer", str(tiny_model_dir)),
        *("--input-len", str(INPUT_LEN), "--warmup", "0"),
    )
    assert code == 1
    summary = result["runs"][0]["summary"]
    assert summary["completed"] == 0 and summary["failed"] == NUM_PROMPTS
    ((error, count),) = summary["errors"].items()
    assert count == NUM_PROMPTS and error.startswith("OpenAIError: HTTP 503")


def test_it_runs_without_the_dev_extras(
    http_url: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "bare.json"
    argv = ["bench", "serve", *QUIET, "--out", str(out), "--url", http_url]
    argv += ["--tokenizer", str(tiny_model_dir), "--input-len", str(INPUT_LEN)]
    run = subprocess.run(
        [sys.executable, "-c", WITHOUT_DEV_EXTRAS, *argv], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-3000:]
    completed_exactly(json.loads(out.read_text())["runs"][0], INPUT_LEN + BOS)
    assert not list(tmp_path.glob("*.png"))  # no matplotlib, no plots, no failure


def test_an_api_key_goes_as_a_bearer_token(
    keyed_http_url: str, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    argv = ["--url", keyed_http_url, "--model", MODEL, "--tokenizer", str(tiny_model_dir)]
    argv += ["--input-len", str(INPUT_LEN)]
    code, result = bench(tmp_path / "keyed.json", *argv, "--api-key", API_KEY)
    assert code == 0
    completed_exactly(result["runs"][0], INPUT_LEN + BOS)
    assert result["config"]["api_key"] is None  # never written out
    with pytest.raises(RuntimeError, match="the warm-up failed: OpenAIError: HTTP 401"):
        bench(tmp_path / "refused.json", *argv)
