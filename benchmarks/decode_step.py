"""Decode step time of our engine vs transformers, beside the memory-bandwidth bound.

A decode step reads every weight it uses once (all but the embedding table, of which it reads a
row), so ``weight bytes / memory bandwidth`` bounds its time from below at small batch. The
bandwidth is measured in the same run by a large tensor copy. To show how far PyTorch's own
matrix-vector kernels allow, the matmuls alone are timed too: one row through every linear layer.
Where the native CPU kernels are built (``kernels/native.py``), our step is timed with them and
with the PyTorch kernels in their place. ``--profile`` lists the ops a step spends its time in.
"""

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.nn import functional as F

from pdserve.engine.checkpoint_format import HF_CONFIG_FILE, gguf_file
from pdserve.engine.config import QUANTIZATIONS
from pdserve.engine.linear import Linear
from pdserve.engine.llm import LLM
from pdserve.engine.model import LlamaForCausalLM
from pdserve.engine.sampling_params import SamplingParams
from pdserve.kernels import native

COPY_BYTES = 1 << 30
PROMPT_LEN = 128
WARMUP_STEPS = 3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", type=Path, default=Path("models/small"), help="an HF folder or a GGUF file"
    )
    parser.add_argument("--preset", default="small", help="made into --model when it is missing")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--quantization", choices=QUANTIZATIONS, help="the engine's weights")
    parser.add_argument(
        "--profile", type=int, default=0, metavar="N", help="list a step's top N ops"
    )


def copy_bandwidth(nbytes: int = COPY_BYTES, repeats: int = 5) -> float:
    """Bytes moved per second (read + write) by ``dst.copy_(src)``, best of ``repeats``."""
    src = torch.ones(nbytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return 2 * nbytes / best


def weight_bytes_read(model: LlamaForCausalLM) -> int:
    """Bytes of the weights one decode step reads: every linear (the head included, tied or not;
    an int8 one with its scales) and norm; the embedding lookup reads one row. Counted from the
    plain weights, as packed linears hold a second copy outside the parameters."""
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    norms = [p for name, p in model.named_parameters() if name.endswith("norm.weight")]
    products = sum(
        m.weight.nbytes + (m.scales.nbytes if m.scales is not None else 0) for m in linears
    )
    return products + sum(p.nbytes for p in norms)


@torch.inference_mode()
def matmul_seconds(model: LlamaForCausalLM, steps: int) -> tuple[float, float]:
    """Median time of one row through every linear layer: (nn.Linear's [out, in] weight, ours)."""
    layers = [m for m in model.modules() if isinstance(m, Linear)]
    dtype = model.model.embed_tokens.weight.dtype
    rows = [torch.randn(1, m.in_features, dtype=dtype) for m in layers]
    # nn.Linear's layout, random values: a packed layer no longer holds its plain weight.
    weights = [torch.randn(m.out_features, m.in_features, dtype=dtype) for m in layers]

    def timed(forward: Callable[[Linear, torch.Tensor, torch.Tensor], torch.Tensor]) -> float:
        times = []
        for i in range(steps + WARMUP_STEPS):
            start = time.perf_counter()
            for layer, weight, x in zip(layers, weights, rows, strict=True):
                forward(layer, weight, x)
            if i >= WARMUP_STEPS:
                times.append(time.perf_counter() - start)
        return statistics.median(times)

    return timed(lambda _, weight, x: F.linear(x, weight)), timed(lambda layer, _, x: layer(x))


def ours_step_seconds(llm: LLM, batch: int, steps: int) -> float:
    """Median wall time of one engine step (schedule + model + sample) with ``batch`` decodes."""
    return statistics.median(_step_times(llm, batch, steps))


def step_profile(llm: LLM, batch: int, steps: int, top: int) -> list[tuple[str, float, float]]:
    """The ``top`` ops by self CPU time over ``steps`` decode steps of ``batch``: (name, ms per
    step, share of the steps' wall time)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        wall = sum(_step_times(llm, batch, steps))
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    return [
        (e.key, e.self_cpu_time_total / 1e3 / steps, e.self_cpu_time_total / 1e6 / wall)
        for e in events[:top]
    ]


def _step_times(llm: LLM, batch: int, steps: int) -> list[float]:
    """Wall time of each of ``steps`` decode steps of ``batch`` sequences, after their prefill
    and a warm-up."""
    engine = llm.engine
    vocab = engine.model_config.vocab_size
    g = torch.Generator().manual_seed(batch)
    params = SamplingParams(temperature=0.0, max_tokens=steps + WARMUP_STEPS + 1, ignore_eos=True)
    for i in range(batch):
        prompt = torch.randint(0, vocab, (PROMPT_LEN,), generator=g).tolist()
        engine.add_request(f"bench-{batch}-{i}", prompt, params)
    engine.step()  # the prefill of every prompt
    for _ in range(WARMUP_STEPS):
        engine.step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    while engine.has_unfinished_requests():
        engine.step()
    return times


@torch.inference_mode()
def hf_step_seconds(model, batch: int, steps: int, vocab: int) -> float:
    """Median time of one transformers forward with a KV cache, ``batch`` rows of one new token."""
    g = torch.Generator().manual_seed(batch)
    ids = torch.randint(0, vocab, (batch, PROMPT_LEN), generator=g)
    out = model(input_ids=ids, use_cache=True)
    cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)
    times = []
    for i in range(steps + WARMUP_STEPS):
        start = time.perf_counter()
        out = model(input_ids=token, past_key_values=cache, use_cache=True)
        token = out.logits[:, -1:].argmax(-1)
        if i >= WARMUP_STEPS:
            times.append(time.perf_counter() - start)
        cache = out.past_key_values
    return statistics.median(times)


def run(args: argparse.Namespace) -> int:
    import transformers

    torch.set_num_threads(args.threads)
    gguf = gguf_file(args.model) if args.model.exists() else None
    if gguf is None and not (args.model / HF_CONFIG_FILE).exists():
        from pdserve.cluster.make_model import make_model

        make_model(args.preset, args.model)
    llm = LLM(model=args.model, dtype=args.dtype, quantization=args.quantization)
    model = llm.engine.runner.model
    weight_bytes = weight_bytes_read(model)
    bandwidth = copy_bandwidth()
    bound = weight_bytes / bandwidth
    mkl_gemv, ours_gemv = matmul_seconds(model, args.steps)
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        args.model if gguf is None else gguf.parent,
        gguf_file=None if gguf is None else gguf.name,
        dtype=llm.engine.config.torch_dtype,
    ).eval()
    vocab = llm.engine.model_config.vocab_size
    print(
        f"model {args.model} ({weight_bytes / 1e6:.0f} MB of weights read per step, {args.dtype}"
        f"{', ' + args.quantization + ' weights' if args.quantization else ''}), "
        f"{args.threads} threads, prompt {PROMPT_LEN} tokens, median of {args.steps} steps"
    )
    print(f"CPU: {native.describe_cpu()}")
    print(f"copy bandwidth {bandwidth / 1e9:.1f} GB/s -> bound {bound * 1e3:.1f} ms per step")
    row = torch.empty(1, 1, dtype=model.model.embed_tokens.weight.dtype)
    ours_name = "native kernel" if native.serves(row) else "PyTorch's"
    for name, seconds in (
        ("nn.Linear, [out, in] (MKL gemv)", mkl_gemv),
        (f"ours, {ours_name}", ours_gemv),
    ):
        print(
            f"matmuls alone, 1 row, {name}: {seconds * 1e3:.1f} ms = "
            f"{weight_bytes / seconds / 1e9:.1f} GB/s = {bound / seconds:.0%} of bound"
        )
    print()
    has_native = native.available()
    columns = ["batch", "ours ms/step", "of bound", "transformers ms/step", "of bound"]
    columns += ["ours / HF speed"] + (
        ["ours, PyTorch kernels ms/step", "native speed-up"] if has_native else []
    )
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for batch in args.batch_sizes:
        ours = ours_step_seconds(llm, batch, args.steps)
        theirs = hf_step_seconds(hf, batch, args.steps, vocab)
        row = [f"{batch}", f"{ours * 1e3:.1f}", f"{bound / ours:.0%}", f"{theirs * 1e3:.1f}"]
        row += [f"{bound / theirs:.0%}", f"{theirs / ours:.2f}x"]
        if has_native:
            with native.disabled():
                plain = ours_step_seconds(llm, batch, args.steps)
            row += [f"{plain * 1e3:.1f}", f"{plain / ours:.2f}x"]
        print("| " + " | ".join(row) + " |")
    for batch in args.batch_sizes if args.profile else []:
        print(f"\nours at batch {batch}, top {args.profile} ops by self CPU time:")
        print("| op | ms/step | of the step |\n|---|---|---|")
        for name, ms, share in step_profile(llm, batch, args.steps, args.profile):
            print(f"| {name} | {ms:.2f} | {share:.0%} |")
    return 0
