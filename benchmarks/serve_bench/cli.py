"""``pdserve bench serve``: the online serving benchmark our users know from ``vllm bench serve``.

Sends a dataset's requests (``--dataset random|prefix-shared|chat``) to an OpenAI-compatible server
(``--url``) or pdserve's gRPC API (``--grpc``) on a seeded schedule: Poisson or gamma arrivals at
``--request-rate`` (several, comma-separated: a sweep, one run per rate), at most
``--max-concurrency`` in flight, or a ``--ramp`` of rate:seconds stages. Each run draws its own
prompts (seed + run index), so the server's prefix cache carries nothing from one run to the next.
``--models a,b --rounds N`` compares models of one server (e.g. one checkpoint served twice with
two routing policies) in alternating rounds: every run goes to each model in turn, with the same
prompts and arrivals, and each model's requests over all rounds are summarised together, b over a:
the comparison on one server, under the same noise, that two servers run one after the other are
not. Prints the summaries (``metrics.py``: TTFT, TPOT, ITL, E2EL, throughputs, goodput under
``--slo``; with ``--probe-interval``, what new clients beside each run saw: ``probe.py``) and
writes ``--out`` (JSON: config, per-request records, summaries) with PNGs beside
it. ``--compare a.json b.json`` prints b's summaries over a's instead, and with ``--out`` plots
both on the same axes there.
"""

import argparse
import asyncio
import contextlib
import json
import os
from pathlib import Path
from typing import Any, NamedTuple

from tqdm import tqdm

from pdserve.benchmarks.arrivals import POISSON, Stage, arrival_offsets, parse_stages, send_times
from pdserve.benchmarks.serve_bench.backends import Backend, open_backend
from pdserve.benchmarks.serve_bench.compare import compare_files, load_pair, pooled_table
from pdserve.benchmarks.serve_bench.datasets import (
    DATASETS,
    BenchRequest,
    PromptShape,
    make_requests,
)
from pdserve.benchmarks.serve_bench.metrics import cell, parse_slos, summarize
from pdserve.benchmarks.serve_bench.plots import write_compare_plots, write_plots
from pdserve.benchmarks.serve_bench.probe import Probe
from pdserve.benchmarks.serve_bench.runner import run_schedule, send_one
from pdserve.engine.tokenizer import Tokenizer

API_KEY_ENV = "OPENAI_API_KEY"
DEFAULT_OUT = Path("bench-serve.json")


class RunPlan(NamedTuple):
    label: str
    request_rate: float | None  # None: a ramp
    stages: list[Stage] | None
    offsets: list[float]
    seed: int  # of its arrivals and prompts


def add_arguments(parser: argparse.ArgumentParser) -> None:
    server = parser.add_mutually_exclusive_group()
    server.add_argument("--url", help="an OpenAI-compatible server, e.g. http://127.0.0.1:8000")
    server.add_argument("--grpc", metavar="HOST:PORT", help="pdserve's gRPC API")
    parser.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_ENV),
        help=f"sent as Authorization: Bearer (default: ${API_KEY_ENV}, as vLLM's bench)",
    )
    models = parser.add_mutually_exclusive_group()
    models.add_argument("--model", help="the served model (default: the server's first)")
    models.add_argument(
        "--models",
        type=_model_list,
        metavar="A,B",
        help="models of the server to compare: every run goes to each in turn (see --rounds)",
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="the runs this many times, each its own seed"
    )
    parser.add_argument(
        "--tokenizer",
        type=Path,
        help="its checkpoint: a folder or a GGUF file (default: --model's, if local)",
    )
    parser.add_argument("--dataset", choices=DATASETS, default="random")
    parser.add_argument(
        "--chat",
        action=argparse.BooleanOptionalAction,
        help="/v1/chat/completions (default: for the chat dataset only)",
    )
    parser.add_argument("--num-prompts", type=int, default=100, help="per run (not a ramp's)")
    parser.add_argument("--input-len", type=int, default=256, help="random: mean prompt tokens")
    parser.add_argument(
        "--output-len", type=int, default=128, help="mean max_tokens (chat: the set's own)"
    )
    parser.add_argument("--range-ratio", type=float, default=0.0, help="lengths: mean * [1±r]")
    parser.add_argument("--num-tenants", type=int, default=4, help="prefix-shared")
    parser.add_argument("--prefix-len", type=int, default=256, help="prefix-shared: shared tokens")
    parser.add_argument("--suffix-len", type=int, default=64, help="prefix-shared: own tokens")
    load = parser.add_mutually_exclusive_group()
    load.add_argument("--request-rate", default="inf", help="req/s, or a sweep: 1,2,4 (inf: all)")
    load.add_argument("--ramp", metavar="STAGES", help="rate:seconds,... (as bench ramp)")
    parser.add_argument(
        "--burstiness", type=float, default=POISSON, help="gamma shape (1: Poisson)"
    )
    parser.add_argument("--max-concurrency", type=int, help="most requests in flight")
    parser.add_argument("--slo", help="goodput's SLOs in ms, e.g. ttft=200,itl=50 (or tpot, e2el)")
    parser.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--warmup", type=int, default=1, help="requests before the runs, untimed")
    parser.add_argument("--seed", type=int, default=0, help="prompts and arrivals")
    parser.add_argument("--disable-tqdm", action="store_true")
    parser.add_argument(
        "--probe-interval",
        type=float,
        metavar="SECONDS",
        help="HTTP: beside each run, from a process of its own, a new client this often sends a "
        "one-token stream and times the server's status line (probe.py)",
    )
    parser.add_argument(
        "--out", type=Path, help="the result JSON (default: bench-serve.json); the PNGs beside it"
    )
    parser.add_argument(
        "--compare",
        nargs=2,
        type=Path,
        metavar=("A", "B"),
        help="b / a, no run; with --out, both plotted on the same axes beside it",
    )


def _model_list(text: str) -> list[str]:
    names = [name for name in text.split(",") if name]
    if len(names) < 2 or len(set(names)) < len(names):
        raise argparse.ArgumentTypeError(f"give two or more distinct models, got {text!r}")
    return names


def plan_runs(args: argparse.Namespace) -> list[RunPlan]:
    """One run per request rate, or one ramp, ``args.rounds`` times; each with its own seed
    (``args.seed`` + index)."""
    if args.rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {args.rounds}")
    plans = []
    for round_ in range(args.rounds):
        suffix = f", round {round_ + 1}" if args.rounds > 1 else ""
        if args.ramp:
            stages = parse_stages(args.ramp)
            seed = args.seed + round_
            offsets = send_times(stages, seed, args.burstiness)
            plans.append(RunPlan(f"ramp {args.ramp}{suffix}", None, stages, offsets, seed))
            continue
        for text in args.request_rate.split(","):
            rate = float(text)
            if rate <= 0:
                raise ValueError(f"a request rate must be > 0 (inf: all at once), got {text!r}")
            label = f"rate {rate:g}" + (
                f", concurrency {args.max_concurrency}" if args.max_concurrency else ""
            )
            seed = args.seed + len(plans)
            offsets = arrival_offsets(args.num_prompts, rate, seed, args.burstiness)
            plans.append(RunPlan(label + suffix, rate, None, offsets, seed))
    return plans


def _tokenizer(args: argparse.Namespace, model: str) -> Tokenizer:
    path = args.tokenizer or (Path(model) if Path(model).exists() else None)
    if path is None:
        raise ValueError(f"the model {model!r} is no local checkpoint: give --tokenizer PATH")
    return Tokenizer.from_pretrained(path)


async def _bench(args: argparse.Namespace, plans: list[RunPlan]) -> dict[str, Any]:
    chat = args.dataset == "chat" if args.chat is None else args.chat
    slos = parse_slos(args.slo)
    shape = PromptShape(
        args.input_len,
        args.output_len,
        args.range_ratio,
        args.num_tenants,
        args.prefix_len,
        args.suffix_len,
    )
    models = args.models or [args.model]
    async with open_backend(
        args.url, args.grpc, models[0], chat, args.ignore_eos, args.api_key
    ) as first:
        backends = [first] + [first.for_model(model) for model in models[1:]]
        tokenizer = _tokenizer(args, first.model)

        def draw(count: int, seed: int) -> list[BenchRequest]:
            return make_requests(args.dataset, tokenizer, shape, count, seed, chat)

        warmup = draw(args.warmup, args.seed + len(plans))
        for backend in backends:
            await _warm_up(backend, warmup)
        runs, pooled = [], {b.model: ([], 0.0) for b in backends}
        for k, plan in enumerate(plans):
            requests = draw(len(plan.offsets), plan.seed)
            # a, b, then b, a: a drift of the machine's speed over the rounds favours neither
            for backend in backends if k % 2 == 0 else backends[::-1]:
                label = plan.label if len(backends) == 1 else f"{backend.model}: {plan.label}"
                probe = _probe(args, backend.model)
                with (
                    tqdm(total=len(requests), desc=label, disable=args.disable_tqdm) as bar,
                    probe or contextlib.nullcontext(),
                ):
                    records, seconds = await run_schedule(
                        backend, requests, plan.offsets, args.max_concurrency, bar
                    )
                so_far, total_s = pooled[backend.model]
                pooled[backend.model] = (so_far + records, total_s + seconds)
                runs.append(
                    {
                        "label": label,
                        "model": backend.model,
                        "request_rate": plan.request_rate,
                        "stages": None
                        if plan.stages is None
                        else [s._asdict() for s in plan.stages],
                        "summary": summarize(records, seconds, slos),
                        "probe": None if probe is None else probe.summary,
                        "requests": [r.row() for r in records],
                    }
                )
    given = vars(args) | {"api_key": None}  # never written to the result
    config = {k: str(v) if isinstance(v, Path) else v for k, v in given.items()}
    server = f"grpc {args.grpc}" if args.grpc else f"http {args.url}" + (" chat" if chat else "")
    return {
        "model": first.model,
        "backend": server,
        "dataset": args.dataset,
        "slos_ms": slos,
        "config": config,
        "runs": runs,
        # each model's requests over every run: what --models compares
        "pooled": {
            model: summarize(records, seconds, slos) for model, (records, seconds) in pooled.items()
        }
        if len(backends) > 1
        else None,
    }


def _probe(args: argparse.Namespace, model: str) -> Probe | None:
    if args.probe_interval is None:
        return None
    if args.url is None:
        raise ValueError("--probe-interval probes the HTTP API: give --url")
    return Probe(args.url, model, args.probe_interval, args.api_key)


async def _warm_up(backend: Backend, requests: list[BenchRequest]) -> None:
    """Untimed requests first: a wrong URL or model fails here, before any run."""
    records = await asyncio.gather(*(send_one(backend, r, 0.0) for r in requests))
    failed = [r.error for r in records if r.error is not None]
    if failed:
        raise RuntimeError(f"the warm-up failed: {failed[0]}")


def print_summaries(result: dict) -> None:
    runs = result["runs"]
    print(f"{result['model']} over {result['backend']}, dataset {result['dataset']}")
    print("| metric | " + " | ".join(run["label"] for run in runs) + " |")
    print("|---" * (len(runs) + 1) + "|")
    for key in (k for k in runs[0]["summary"] if k != "errors"):
        print(f"| {key} | " + " | ".join(cell(run["summary"][key]) for run in runs) + " |")
    for run in runs:
        for error, count in run["summary"]["errors"].items():
            print(f"{run['label']}: {count} failed: {error}")
        for status, seen in (run["probe"] or {}).items():
            spread = ", ".join(f"{k[:-3]} {v:.0f}" for k, v in seen.items() if k.endswith("_ms"))
            print(
                f"{run['label']}: the probe's {status}s: {seen['count']} "
                f"({seen['retry_after']} with Retry-After), ms to the status line: {spread}"
            )
    if result["pooled"]:
        print(f"\nevery model's requests over its {len(runs) // len(result['pooled'])} runs:")
        print("\n".join(pooled_table(result["pooled"])))


def run(args: argparse.Namespace) -> int:
    if args.compare:
        results = load_pair(*args.compare)
        print("\n".join(compare_files(*args.compare, results)))
        if args.out is not None:
            for png in write_compare_plots(results, args.out):
                print(f"plotted {png}")
        return 0
    out = args.out or DEFAULT_OUT
    out.parent.mkdir(parents=True, exist_ok=True)
    result = asyncio.run(_bench(args, plan_runs(args)))
    out.write_text(json.dumps(result, indent=1))
    print_summaries(result)
    print(f"wrote {out}")
    for png in write_plots(result, out):
        print(f"plotted {png}")
    return 1 if any(run["summary"]["failed"] for run in result["runs"]) else 0
