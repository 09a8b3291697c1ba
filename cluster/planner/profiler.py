"""Profile a replica for the planner (``pdserve profile --model DIR --out profile.json``).

Runs the engine in this process, on as many torch threads as a replica has (Ray gives a replica
with ``num_cpus`` 0 one thread), and measures:

- prefill: one prompt of each length alone, from its add to its first token (the best of a few
  runs, each on a fresh prompt so the prefix cache never helps);
- decode: ``batch`` requests of ``context`` tokens each, once all are decoding, the median step
  (so steps another process slowed stay out of it).

Writes the ``Profile`` JSON the planner reads and, where matplotlib is installed, a PNG of both
curves beside it.
"""

import argparse
import os
import statistics
import time
from pathlib import Path

import torch
from tqdm import tqdm

from pdserve.cluster.planner.profile import DecodePoint, PrefillPoint, Profile
from pdserve.cluster.plotting import pyplot
from pdserve.engine.config import EngineConfig
from pdserve.engine.llm_engine import LLMEngine
from pdserve.engine.sampling_params import SamplingParams
from pdserve.kernels import native

PREFILL_TOKENS = (16, 64, 128, 256, 512, 1024, 2048)
DECODE_BATCHES = (1, 2, 4, 8, 16, 32, 64)
DECODE_CONTEXTS = (128, 512, 1024)
PREFILL_RUNS = 3
DECODE_STEPS = 16
WARMUP_TOKENS, WARMUP_BATCH = 64, 4  # first calls pay one-time costs: measured, then dropped
REPLICA_THREADS = int(os.environ.get("OMP_NUM_THREADS", "1"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, type=Path, help="HF checkpoint directory")
    parser.add_argument("--out", required=True, type=Path, help="profile JSON to write")
    parser.add_argument("--threads", type=int, default=REPLICA_THREADS, help="torch threads")
    parser.add_argument("--prefill-tokens", type=int, nargs="+", default=PREFILL_TOKENS)
    parser.add_argument("--decode-batches", type=int, nargs="+", default=DECODE_BATCHES)
    parser.add_argument("--decode-contexts", type=int, nargs="+", default=DECODE_CONTEXTS)
    parser.add_argument("--dtype", default="float32")


class _Prompts:
    """Fresh random prompts, so no measurement finds another's blocks in the prefix cache."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.generator = torch.Generator().manual_seed(0)
        self.count = 0

    def __call__(self, length: int) -> list[int]:
        self.count += 1
        return torch.randint(0, self.vocab_size, (length,), generator=self.generator).tolist()


def _run_to_end(engine: LLMEngine) -> None:
    while engine.has_unfinished_requests():
        engine.step()


def prefill_seconds(engine: LLMEngine, prompts: _Prompts, tokens: int, runs: int) -> float:
    best = float("inf")
    for _ in range(runs):
        request_id = f"prefill-{prompts.count}"
        start = time.perf_counter()
        engine.add_request(request_id, prompts(tokens), SamplingParams(max_tokens=1))
        _run_to_end(engine)
        best = min(best, time.perf_counter() - start)
    return best


def decode_step_seconds(
    engine: LLMEngine, prompts: _Prompts, batch: int, context: int, steps: int
) -> float:
    params = SamplingParams(max_tokens=steps + 2, ignore_eos=True)
    ids = [f"decode-{prompts.count}-{i}" for i in range(batch)]
    for request_id in ids:
        engine.add_request(request_id, prompts(context), params)
    while engine.stats().num_queued_prefill_tokens:  # every prompt in, every request decoding
        engine.step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    _run_to_end(engine)
    return statistics.median(times)


def profile_model(args: argparse.Namespace) -> Profile:
    torch.set_num_threads(args.threads)
    engine = LLMEngine(EngineConfig(model=str(args.model), dtype=args.dtype))
    # The grid's points the model serves: a prompt and its first token, a context and its steps.
    limit = engine.max_model_len
    prefill_tokens = [n for n in args.prefill_tokens if n < limit]
    contexts = [c for c in args.decode_contexts if c + DECODE_STEPS + 2 < limit]
    if not prefill_tokens or not contexts:
        raise ValueError(f"the model serves {limit} tokens: no point of the grid fits")
    skipped = sorted(set(args.prefill_tokens) - set(prefill_tokens))
    skipped += [f"context {c}" for c in args.decode_contexts if c not in contexts]
    if skipped:
        print(f"profile: the model serves {limit} tokens; skipping {skipped}", flush=True)
    prompts = _Prompts(engine.model_config.vocab_size)
    prefill_seconds(engine, prompts, WARMUP_TOKENS, 1)
    decode_step_seconds(engine, prompts, WARMUP_BATCH, WARMUP_TOKENS, DECODE_STEPS)
    decode_grid = [(b, c) for c in contexts for b in args.decode_batches]
    with tqdm(total=len(prefill_tokens) + len(decode_grid), desc="profile") as bar:
        prefill = []
        for tokens in prefill_tokens:
            seconds = prefill_seconds(engine, prompts, tokens, PREFILL_RUNS)
            prefill.append(PrefillPoint(tokens, seconds))
            bar.update()
        decode = []
        for batch, context in decode_grid:
            seconds = decode_step_seconds(engine, prompts, batch, context, DECODE_STEPS)
            decode.append(DecodePoint(batch, context, seconds))
            bar.update()
    meta = {
        "cpu": native.cpu_name(),
        "threads": args.threads,
        "dtype": args.dtype,
        "measured": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    return Profile(args.model.name, tuple(prefill), tuple(decode), meta)


def plot(profile: Profile, path: Path) -> bool:
    """Both curves as a PNG; False (nothing written) where matplotlib is not installed."""
    plt = pyplot()
    if plt is None:
        return False
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    points = sorted(profile.prefill, key=lambda p: p.tokens)
    left.plot([p.tokens for p in points], [p.seconds * 1e3 for p in points], marker="o")
    left.set(xlabel="prompt tokens", ylabel="prefill ms", title="prefill, one prompt alone")
    for context in profile.contexts:
        row = sorted((p for p in profile.decode if p.context == context), key=lambda p: p.batch)
        right.plot(
            [p.batch for p in row], [p.seconds * 1e3 for p in row], marker="o", label=f"{context}"
        )
    right.set(xlabel="batch (requests)", ylabel="step ms", title="decode step")
    right.legend(title="context tokens")
    fig.suptitle(
        f"{profile.model}: {profile.meta.get('cpu', '')}, {profile.meta.get('threads')} thread(s)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def profile_and_save(model: Path, out: Path) -> Profile:
    """Profiles ``model`` on the default grid; writes ``out`` and its plot."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return run_profile(parser.parse_args(["--model", str(model), "--out", str(out)]))


def run_profile(args: argparse.Namespace) -> Profile:
    profile = profile_model(args)
    profile.save(args.out)
    print(f"profile: wrote {args.out}")
    png = args.out.with_suffix(".png")
    if plot(profile, png):
        print(f"profile: plotted {png}")
    else:
        print("profile: no plot (matplotlib is not installed)")
    return profile


def run(args: argparse.Namespace) -> int:
    run_profile(args)
    return 0
