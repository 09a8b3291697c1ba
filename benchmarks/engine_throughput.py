"""Offline throughput on a heterogeneous workload: our engine vs transformers' static batches.

Both run in this process on the same threads and weights; ours runs twice, before and after
transformers, and its mean time counts. transformers pads every static batch to its longest
prompt and decodes every row to its longest output, so the slots past a row's own length are
waste; continuous batching admits and retires requests per step instead. The workload's FLOPs
over a matmul throughput measured in the same run (in the run's dtype) give a compute bound, and
the scheduler is timed alone (no model) with 256 running requests. Where the native CPU kernels
are built, ours runs once more with the PyTorch kernels in their place. ``--dtype bfloat16`` runs
both sides in bf16. ``--model`` is an HF folder or a GGUF file (transformers loads the same
file). The workload is in ``workload.py``, the scheduler timing in ``scheduler_step.py``.
"""

import argparse
import statistics
import time
from pathlib import Path
from typing import NamedTuple

import torch

from pdserve.benchmarks.scheduler_step import SCHEDULER_RUNNING, scheduler_step_seconds
from pdserve.benchmarks.workload import (
    FULL,
    QUICK,
    SEED,
    WorkItem,
    make_workload,
    useful_tokens,
    workload_flops,
)
from pdserve.engine.checkpoint_format import gguf_file
from pdserve.engine.llm import LLM
from pdserve.engine.sampling_params import SamplingParams
from pdserve.kernels import native

HF_BATCH_SIZE = 16
# [n, n] x [n, n], grown while one product takes under MATMUL_BUDGET_S: large enough for MKL's
# peak, small enough to repeat on a CPU that emulates the dtype (bf16 without AVX512-BF16 or AMX).
MATMUL_SIZES = (256, 512, 1024, 2048)
MATMUL_BUDGET_S = 0.25
MATMUL_REPEATS = 5
WARMUP_REQUESTS = 4


class OursResult(NamedTuple):
    seconds: float
    output_lens: list[int]  # tokens each request generated, in workload order


class HFResult(NamedTuple):
    seconds: float
    useful_tokens: int  # generated tokens within each request's own length
    decode_waste: float  # fraction of decode slots that were past a row's length
    prefill_waste: float  # fraction of prefill tokens that were left padding


def run_ours(llm: LLM, workload: list[WorkItem]) -> OursResult:
    """One ``generate`` call over the whole workload; raises if an output misses its length."""
    params = [
        SamplingParams(temperature=0.0, max_tokens=item.output_len, ignore_eos=True)
        for item in workload
    ]
    start = time.perf_counter()
    outputs = llm.generate([item.prompt for item in workload], params)
    seconds = time.perf_counter() - start
    for i, (item, output) in enumerate(zip(workload, outputs, strict=True)):
        if len(output.token_ids) != item.output_len:
            raise RuntimeError(
                f"request {i}: asked for {item.output_len} tokens, got {len(output.token_ids)}"
            )
    return OursResult(seconds, [len(output.token_ids) for output in outputs])


@torch.inference_mode()
def run_hf(model, workload: list[WorkItem], batch_size: int, pad_id: int) -> HFResult:
    """transformers ``generate`` in static batches, arrival order, left padding, greedy."""
    useful = decode_slots = prefill_slots = prompt_tokens = 0
    start = time.perf_counter()
    for first in range(0, len(workload), batch_size):
        batch = workload[first : first + batch_size]
        width = max(len(item.prompt) for item in batch)
        pads = [width - len(item.prompt) for item in batch]
        ids = torch.tensor(
            [[pad_id] * p + item.prompt for p, item in zip(pads, batch, strict=True)]
        )
        mask = torch.tensor([[0] * p + [1] * (width - p) for p in pads])
        longest = max(item.output_len for item in batch)
        # min_new_tokens = max_new_tokens: no row stops early, the static batch's whole cost.
        out = model.generate(
            ids,
            attention_mask=mask,
            do_sample=False,
            pad_token_id=pad_id,
            max_new_tokens=longest,
            min_new_tokens=longest,
        )
        generated = out.shape[1] - width
        useful += sum(min(item.output_len, generated) for item in batch)
        decode_slots += len(batch) * generated
        prefill_slots += len(batch) * width
        prompt_tokens += sum(len(item.prompt) for item in batch)
    seconds = time.perf_counter() - start
    return HFResult(seconds, useful, 1 - useful / decode_slots, 1 - prompt_tokens / prefill_slots)


def matmul_flops_per_second(
    dtype: torch.dtype = torch.float32, repeats: int = MATMUL_REPEATS
) -> float:
    """``torch.mm`` throughput in ``dtype`` on the current threads, best of ``repeats``, at the
    first of ``MATMUL_SIZES`` whose product takes over ``MATMUL_BUDGET_S`` (or the largest)."""
    for size in MATMUL_SIZES:
        a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
        start = time.perf_counter()
        torch.mm(a, b)  # also MKL's first call at this size, which sets up its buffers
        if time.perf_counter() - start > MATMUL_BUDGET_S:
            break
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", type=Path, default=Path("models/tiny"), help="an HF folder or a GGUF file"
    )
    parser.add_argument("--preset", default="tiny", help="made into --model when it is missing")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--hf-batch-size", type=int, default=HF_BATCH_SIZE)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--quick", action="store_true", help="16 short requests, for tests")


def _cold(llm: LLM) -> LLM:
    """``llm`` with an empty prefix cache, for a run that must not reuse the last one's blocks."""
    if not llm.reset_prefix_cache():
        raise RuntimeError("the engine still holds KV blocks after its run")
    return llm


def _stats(values: list[int]) -> str:
    mean, median = statistics.mean(values), statistics.median(values)
    return f"mean {mean:.0f}, median {median:.0f}, max {max(values)}"


def run(args: argparse.Namespace) -> int:
    import transformers

    torch.set_num_threads(args.threads)
    if not args.model.exists():
        from pdserve.cluster.make_model import make_model

        make_model(args.preset, args.model)
    dtype = getattr(torch, args.dtype)
    llm = LLM(model=args.model, dtype=args.dtype)
    model_config = llm.engine.model_config
    shape = QUICK if args.quick else FULL
    workload = make_workload(model_config.vocab_size, shape, args.seed)
    warmup = make_workload(model_config.vocab_size, QUICK, args.seed + 1)[:WARMUP_REQUESTS]
    gguf = gguf_file(args.model)
    folder, file = (gguf.parent, gguf.name) if gguf is not None else (args.model, None)
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=file, dtype=dtype
    ).eval()
    tokenizer = llm.get_tokenizer()
    pad_id = tokenizer.eos_token_id if tokenizer.pad_token_id is None else tokenizer.pad_token_id

    run_ours(llm, warmup)  # first-call costs (allocator, MKL buffers) out of both timings
    run_hf(hf, warmup, args.hf_batch_size, pad_id)
    # Ours runs before and after transformers, from a cold prefix cache each time, and the ratio
    # takes the mean: this VM's speed drifts within a minute (docs/benchmarks.md).
    ours_before = run_ours(llm, workload).seconds
    theirs = run_hf(hf, workload, args.hf_batch_size, pad_id)
    ours_after = run_ours(_cold(llm), workload).seconds
    ours_s = (ours_before + ours_after) / 2
    plain_s = None
    if native.available():
        with native.disabled():
            plain_s = run_ours(_cold(llm), workload).seconds
    useful = useful_tokens(workload)
    if theirs.useful_tokens != useful:
        raise RuntimeError(f"transformers made {theirs.useful_tokens} useful tokens, not {useful}")
    flops = workload_flops(model_config, workload)
    peak = matmul_flops_per_second(dtype)
    bound = useful / (flops / peak)
    sched_s = scheduler_step_seconds()
    ours, hf_rate = useful / ours_s, useful / theirs.seconds

    prompts, outputs = [len(w.prompt) for w in workload], [w.output_len for w in workload]
    print(f"model {args.model} ({args.dtype}), {args.threads} threads, seed {args.seed}")
    print(f"CPU: {native.describe_cpu()}")
    print(
        f"{len(workload)} requests; prompts uniform in {list(shape.prompt_len)}: {_stats(prompts)}"
    )
    print(
        f"outputs lognormal(median {shape.output_median}, sigma {shape.output_sigma}) clipped to "
        f"{list(shape.output_len)}: {_stats(outputs)}"
    )
    print(
        f"ours {ours_s:.2f} s (mean of {ours_before:.2f} s before transformers and "
        f"{ours_after:.2f} s after), transformers {theirs.seconds:.2f} s, for {useful} useful "
        f"tokens; workload {flops / 1e9:.1f} GFLOP, {args.dtype} mm {peak / 1e9:.1f} GFLOP/s\n"
    )
    rows = [
        ("useful tok/s, ours (continuous batching)", f"{ours:.0f}"),
        (f"useful tok/s, transformers (static batches of {args.hf_batch_size})", f"{hf_rate:.0f}"),
        ("ours / transformers", f"{ours / hf_rate:.2f}x"),
        ("transformers decode slots wasted", f"{theirs.decode_waste:.0%}"),
        ("transformers prefill tokens that are padding", f"{theirs.prefill_waste:.0%}"),
        ("compute bound, useful tok/s", f"{bound:.0f}"),
        ("ours, fraction of the bound", f"{ours / bound:.1%}"),
        (f"scheduler ms/step, {SCHEDULER_RUNNING} running", f"{sched_s * 1e3:.3f}"),
    ]
    if plain_s is not None:
        rows += [
            ("useful tok/s, ours with the PyTorch kernels", f"{useful / plain_s:.0f}"),
            ("native kernels' speed-up", f"{plain_s / ours_s:.2f}x"),
        ]
    print("| metric | value |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")
    quick = " --quick" if args.quick else ""
    print(
        f"\ncommand: pdserve bench engine --model {args.model} --threads {args.threads} "
        f"--hf-batch-size {args.hf_batch_size} --dtype {args.dtype} --seed {args.seed}{quick}"
    )
    return 0
