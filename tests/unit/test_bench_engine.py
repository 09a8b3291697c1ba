"""The engine-throughput benchmark's pieces, in quick mode on the tiny model."""

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import transformers

from pdserve.benchmarks import engine_throughput as bench
from pdserve.benchmarks import workload as wl
from pdserve.benchmarks.scheduler_step import scheduler_step_seconds
from pdserve.cluster import cli
from pdserve.engine.config import ModelConfig
from pdserve.engine.llm import LLM
from pdserve.tests.gguf_models import write_gguf

HF_BATCH_SIZE = 8  # two static batches of the 16 quick requests


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    # With other tests running beside this one, torch's two OpenMP workers wait on each other at
    # every op, so one thread runs the quick workload many times faster (docs/benchmarks.md).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def workload(tiny_model_dir: Path) -> list[wl.WorkItem]:
    vocab = ModelConfig.from_pretrained(tiny_model_dir).vocab_size
    return wl.make_workload(vocab, wl.QUICK)


def test_workload_is_seeded_and_within_its_ranges(tiny_model_dir: Path) -> None:
    vocab = ModelConfig.from_pretrained(tiny_model_dir).vocab_size
    first, again = wl.make_workload(vocab, wl.FULL), wl.make_workload(vocab, wl.FULL)
    assert first == again and len(first) == wl.FULL.num_requests
    low, high = wl.FULL.output_len
    assert all(low <= item.output_len <= high for item in first)
    assert all(0 <= t < vocab for item in first for t in item.prompt)
    # Heterogeneous, heavy-tailed: the longest output is several times the median.
    lengths = sorted(item.output_len for item in first)
    assert lengths[-1] > 3 * lengths[len(lengths) // 2]


def test_ours_and_transformers_make_the_same_useful_tokens(
    tiny_model_dir: Path, workload: list[wl.WorkItem]
) -> None:
    ours = bench.run_ours(LLM(model=tiny_model_dir), workload)
    assert ours.seconds > 0
    assert ours.output_lens == [item.output_len for item in workload]

    hf = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    pad_id = transformers.AutoTokenizer.from_pretrained(tiny_model_dir).pad_token_id
    result = bench.run_hf(hf.eval(), workload, HF_BATCH_SIZE, pad_id)
    assert result.seconds > 0
    assert result.useful_tokens == wl.useful_tokens(workload)
    # A heterogeneous static batch always pads some prompts and decodes past some outputs.
    assert 0 < result.decode_waste < 1 and 0 < result.prefill_waste < 1
    batches = [workload[i : i + HF_BATCH_SIZE] for i in range(0, len(workload), HF_BATCH_SIZE)]
    slots = sum(len(b) * max(item.output_len for item in b) for b in batches)
    assert result.decode_waste == pytest.approx(1 - wl.useful_tokens(workload) / slots)


def test_workload_flops_formula() -> None:
    config = ModelConfig.from_dict(
        {
            "model_type": "llama",
            "vocab_size": 10,
            "hidden_size": 4,
            "intermediate_size": 6,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 2,
        }
    )
    # W = 2 layers * (4*2*(2*2 + 2*1) + 3*4*6) = 240, H = 40; prompt 3 + output 2 -> n = 4.
    flops = wl.workload_flops(config, [wl.WorkItem([1, 2, 3], 2)])
    assert flops == 2 * 240 * 4 + 2 * 40 * 2 + 4 * 2 * 2 * 2 * (1 + 2 + 3 + 4)


def test_scheduler_step_time_with_256_running() -> None:
    seconds = scheduler_step_seconds(num_running=256, steps=20)
    assert 0 < seconds < 1


def test_registered_as_pdserve_bench_engine() -> None:
    module, args = cli.dispatch("pdserve", cli.SUBCOMMANDS, ["bench", "engine", "--quick"])
    assert module is bench
    assert args.quick and args.hf_batch_size == bench.HF_BATCH_SIZE


@pytest.mark.slow
def test_a_quick_run_in_bf16_names_its_dtype_and_ratio(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture
) -> None:
    argv = ["bench", "engine", "--quick", "--model", str(tiny_model_dir), "--threads", "1"]
    assert cli.main([*argv, "--dtype", "bfloat16"]) == 0
    printed = capsys.readouterr().out
    assert f"model {tiny_model_dir} (bfloat16), 1 threads" in printed
    assert "bfloat16 mm" in printed and "| ours / transformers |" in printed
    assert "--dtype bfloat16" in printed  # the command that reproduces it


@pytest.mark.slow
def test_a_quick_run_on_a_gguf_file_loads_it_on_both_sides(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    pytest.importorskip("accelerate", reason="transformers loads a GGUF only with accelerate")
    gguf = tmp_path / "tiny-F32.gguf"
    write_gguf(gguf, tiny_model_dir)
    argv = ["bench", "engine", "--quick", "--model", str(gguf), "--threads", "1"]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert f"model {gguf} (float32), 1 threads" in printed and "| ours / transformers |" in printed
