"""``pdserve bench chaos``: ``--streams`` concurrent streams for ``--seconds`` against a running
pdserve while replicas are killed and clients walk away; checks that nothing leaks.

Each stream is a client loop sending greedy streamed completions (random prompts of the
``--tokenizer``'s words, serve_bench's ``random`` dataset) back to back; ``--disconnect-fraction``
of them are abandoned mid-stream (``chaos_load.py``). Every ``--kill-every`` seconds one replica of
the next role in ``--kill`` is killed (``ray.kill`` of its actor, from a driver joined to the
cluster at ``--address``; ``chaos_kills.py``); Serve replaces it and the router migrates its
decode streams. A killed router replica's own streams are cut with it (their connections end
there); they are counted apart, and may not outnumber what it carried. Faults in KV transfers
are the server's to inject (``kv_transfer.fault_injection``). Once the streams have ended, it
waits until every replica of the model's pools has all its KV blocks free and the router is
whole again; with ``--reference-model`` it then computes every completed stream's greedy tokens
offline (``chaos_greedy.py``). It reports the streams' endings, the migrations, the kills, the
greedy check, and each replica's KV blocks and resident memory (``chaos_report.py``). Exit
status 1 if an accepted stream failed (an error, or not exactly ``max_tokens`` tokens), more
streams were cut than the killed router replicas carried, a completed stream differs from the
offline engine, or a replica's blocks are not all free by ``--settle-timeout``.
"""

import argparse
import asyncio
import itertools
import json
import random
import time
from pathlib import Path

import ray

from pdserve.benchmarks.chaos_greedy import greedy_differences
from pdserve.benchmarks.chaos_kills import Kill, kill_plan, parse_roles, run_kills
from pdserve.benchmarks.chaos_load import Outcome, cut_by_router_kills, run_load
from pdserve.benchmarks.chaos_replicas import (
    ROLES,
    MigrationCount,
    pool_stats,
    router_size,
    settled_pool_stats,
)
from pdserve.benchmarks.chaos_report import print_report, problems, replica_rows, summarize
from pdserve.benchmarks.openai_http import OpenAIClient
from pdserve.benchmarks.serve_bench.datasets import (
    BenchRequest,
    PromptShape,
    make_requests,
    word_pool,
)
from pdserve.cluster.ray_driver import init_ray
from pdserve.engine.tokenizer import Tokenizer
from pdserve.serving.config import ROUTER_DEPLOYMENT

DATASET = "random"
DEFAULT_SETTLE_TIMEOUT_S = 120.0  # replacements load their model, aborts free their blocks


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the server (no /v1)")
    parser.add_argument("--address", default="auto", help="its Ray cluster, joined to kill")
    parser.add_argument("--model", help="the served model (default: the server's first)")
    parser.add_argument("--tokenizer", type=Path, required=True, help="its directory")
    parser.add_argument("--streams", type=int, default=8, help="client loops at once")
    parser.add_argument("--seconds", type=float, default=300.0, help="new requests until then")
    parser.add_argument("--kill-every", type=float, default=30.0, help="seconds between kills")
    parser.add_argument(
        "--kill",
        default="decode,prefill",
        help=f"roles killed in turn, among {','.join(ROLES)} ('': no kills)",
    )
    parser.add_argument(
        "--disconnect-fraction", type=float, default=0.1, help="requests the client abandons"
    )
    parser.add_argument("--input-len", type=int, default=128, help="mean prompt tokens")
    parser.add_argument("--output-len", type=int, default=128, help="mean max_tokens")
    parser.add_argument("--range-ratio", type=float, default=0.0, help="lengths: mean * [1±r]")
    parser.add_argument(
        "--settle-timeout",
        type=float,
        default=DEFAULT_SETTLE_TIMEOUT_S,
        help="seconds for every replica to answer with all its KV blocks free",
    )
    parser.add_argument(
        "--reference-model",
        type=Path,
        help="check every completed stream against the offline engine on this model "
        "(its default engine config)",
    )
    parser.add_argument("--seed", type=int, default=0, help="prompts, disconnects and victims")
    parser.add_argument("--out", type=Path, default=Path("chaos.json"))


class Draw:
    """A fresh prompt for each request, seeded by its number, so the prefix cache carries
    nothing from one request to the next."""

    def __init__(self, tokenizer: Tokenizer, shape: PromptShape, seed: int) -> None:
        self.tokenizer, self.shape, self.seeds = tokenizer, shape, itertools.count(seed)
        word_pool(tokenizer)  # built now, not in the run: it decodes the whole vocabulary

    def __call__(self) -> BenchRequest:
        (request,) = make_requests(
            DATASET, self.tokenizer, self.shape, 1, next(self.seeds), chat=False
        )
        return request


async def _first_model(url: str) -> str:
    async with OpenAIClient(url) as client:
        return (await client.models())[0]


async def _chaos(
    args: argparse.Namespace,
    model: str,
    plan: list[tuple[float, str]],
    draw: Draw,
    migrated: MigrationCount,
) -> tuple[list[Outcome], int, list[Kill], float]:
    start = time.monotonic()
    async with OpenAIClient(args.url) as client:
        rng = random.Random(args.seed)
        kills = asyncio.create_task(run_kills(plan, model, start, rng, migrated))
        outcomes = await run_load(
            client,
            model,
            draw,
            args.streams,
            args.disconnect_fraction,
            start + args.seconds,
            args.seed,
        )
        done = await kills
    routers = [k for k in done if k.deployment == ROUTER_DEPLOYMENT and k.replica]
    windows = [(start + k.counted_s, start + k.at_s) for k in routers]
    outcomes, uncounted = cut_by_router_kills(outcomes, windows)
    return outcomes, uncounted, done, time.monotonic() - start


def run(args: argparse.Namespace) -> int:
    plan = kill_plan(parse_roles(args.kill), args.kill_every, args.seconds)
    if not 0 <= args.disconnect_fraction <= 1:
        raise ValueError(f"--disconnect-fraction must be in [0, 1], got {args.disconnect_fraction}")
    # The random dataset's lengths; no shared prefixes.
    shape = PromptShape(
        args.input_len, args.output_len, args.range_ratio, num_tenants=1, prefix_len=0, suffix_len=0
    )
    draw = Draw(Tokenizer.from_pretrained(args.tokenizer), shape, args.seed)
    model = args.model or asyncio.run(_first_model(args.url))
    init_ray(address=args.address, log_to_driver=False)
    try:
        start_stats = pool_stats(model, args.settle_timeout)
        routers, migrated = router_size(), MigrationCount(model)
        chaos = _chaos(args, model, plan, draw, migrated)
        outcomes, uncounted, kills, seconds = asyncio.run(chaos)
        sizes = {deployment: len(replicas) for deployment, replicas in start_stats.items()}
        end_stats = settled_pool_stats(model, sizes, routers, args.settle_timeout)
        num_migrated = migrated.total()
    finally:
        ray.shutdown()
    greedy = None
    if args.reference_model is not None:
        greedy = greedy_differences(args.reference_model, outcomes)
    summary = summarize(outcomes) | {"cut_sent_during_a_kill": uncounted}
    rows = replica_rows(start_stats, end_stats, kills)
    result = {
        "model": model,
        "url": args.url,
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "seconds": seconds,
        "summary": summary,
        "migrated": num_migrated,
        "kills": [kill._asdict() for kill in kills],
        "greedy": greedy,
        "replicas": rows,
        "problems": problems(summary, rows, kills, greedy),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print_report(result)
    print(f"wrote {args.out}")
    return 1 if result["problems"] else 0
