"""Serving latency: TTFT and ITL through the cluster (aggregated, disaggregated) vs offline.

One workload (the engine benchmark's heterogeneous prompts and outputs, outputs capped short),
greedy with ``ignore_eos``, sent on one seeded schedule three times: into an in-process
``AsyncLLMEngine`` (the baseline), then over HTTP (aiohttp, ``openai_http.py``), streaming
``/v1/completions``, into a local cluster of one decode replica (aggregated), then into the app
redeployed as one prefill and one decode replica (disaggregated; fresh replicas, so no prefix cache
carries over). Every time is taken at the client, each run after a few untimed warm-up requests.
Then short prompts with ``max_tokens`` 1, each sent to the idle in-process engine and then over the
aggregated cluster's HTTP, one after the other: the TTFT the cluster adds, taken apart with the
router's own timings of each request (``router/timing.py``) into the HTTP proxy and client, the
router's own share (the router's added latency), the Serve call to the worker, and the replica's
engine. Timing rules: ``stream_timing.py``. With ``--metrics-rounds N``, then the aggregated
run again N times with the model's metrics off and on in turn (redeployed each time), for the
metrics' overhead: runs side by side, since this VM's speed drifts between minutes.
"""

import argparse
import asyncio
import math
import os
import random
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import NamedTuple, TypeVar

import numpy as np
import torch

from pdserve.benchmarks.arrivals import arrival_offsets
from pdserve.benchmarks.openai_http import OpenAIClient
from pdserve.benchmarks.stream_timing import (
    Send,
    Summary,
    http_request,
    measure,
    offline_sender,
    warm_up,
)
from pdserve.benchmarks.workload import FULL, SEED, WorkItem, make_workload
from pdserve.engine.async_engine import AsyncLLMEngine
from pdserve.engine.config import ModelConfig
from pdserve.serving.config import DEFAULT_LOCAL_PREFILL_MAX_TOKENS, ClusterConfig

MAX_OUTPUT_LEN = 64  # caps the workload's heavy tail, so a run takes minutes on 2 busy cores
REQUEST_RATE = 4.0  # requests/s, Poisson: below the offline engine's capacity on 2 busy cores
NUM_KV_BLOCKS = 4096  # per engine: 64k tokens, the whole workload at once with room to spare
WARMUP_REQUESTS = 4
OVERHEAD_REQUESTS = 100
OVERHEAD_PROMPT_LEN = 16
OVERHEAD_AIM_MS = 5.0  # issue 5: the router's added latency, p50
CLUSTERS = {"aggregated": 0, "disaggregated": 1}  # run -> prefill replicas (1 decode replica)
# Ray gives an actor with num_cpus 0 (our pools' default) OMP_NUM_THREADS=1 unless it is set, so
# the replicas' engines run on that many torch threads; the offline engine matches them.
REPLICA_THREADS = int(os.environ.get("OMP_NUM_THREADS", "1"))


class ClusterRun(NamedTuple):
    summary: Summary
    remote: int  # measured requests the router sent to the prefill pool


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, default=Path("models/tiny"))
    parser.add_argument("--preset", default="tiny", help="made into --model when it is missing")
    parser.add_argument("--num-requests", type=int, default=FULL.num_requests)
    parser.add_argument("--max-output-len", type=int, default=MAX_OUTPUT_LEN)
    parser.add_argument(
        "--request-rate", type=float, default=REQUEST_RATE, help="Poisson, req/s; inf: all at once"
    )
    parser.add_argument("--seed", type=int, default=SEED, help="workload and arrivals")
    parser.add_argument("--threads", type=int, default=REPLICA_THREADS, help="offline engine's")
    parser.add_argument("--num-kv-blocks", type=int, default=NUM_KV_BLOCKS, help="per engine")
    parser.add_argument(
        "--local-prefill-max-tokens", type=int, default=DEFAULT_LOCAL_PREFILL_MAX_TOKENS
    )
    parser.add_argument("--warmup", type=int, default=WARMUP_REQUESTS, help="before each run")
    parser.add_argument("--overhead-requests", type=int, default=OVERHEAD_REQUESTS)
    parser.add_argument(
        "--metrics-rounds", type=int, default=0, help="aggregated runs with metrics off, then on"
    )
    parser.add_argument(
        "--address", help="deploy on this running Ray cluster (its app is deleted at the end)"
    )
    parser.add_argument("--http-port", type=int, help="Serve's (default: a free one)")
    parser.add_argument("--grpc-port", type=int, help="Serve's (default: a free one)")


def cluster_config(
    args: argparse.Namespace, prefill_replicas: int, ports: tuple[int, int], metrics: bool = True
) -> ClusterConfig:
    model = {
        "name": args.model.name,
        "metrics": metrics,
        "path": str(args.model.resolve()),
        "engine": {"num_kv_blocks": args.num_kv_blocks},
        "prefill": {"replicas": prefill_replicas},
        "decode": {"replicas": 1},
        "routing": {"local_prefill_max_tokens": args.local_prefill_max_tokens},
    }
    return ClusterConfig(models=[model], http_port=ports[0], grpc_port=ports[1])


T = TypeVar("T")


async def _over_http(config: ClusterConfig, use: Callable[[Send], Awaitable[T]]) -> T:
    name = config.models[0].name
    async with OpenAIClient(f"http://127.0.0.1:{config.http_port}") as client:
        return await use(lambda item: http_request(client, name, item))


def _route_decisions(name: str) -> dict[str, int]:
    from ray import serve

    from pdserve.cluster.serve import APP_NAME

    return serve.get_app_handle(APP_NAME).route_decisions.remote().result()["models"][name]


def measure_cluster(
    config: ClusterConfig, workload: list[WorkItem], warmup: list[WorkItem], offsets: list[float]
) -> ClusterRun:
    """The workload over HTTP into the running cluster, after the warm-up requests."""
    name = config.models[0].name
    asyncio.run(_over_http(config, lambda send: warm_up(send, warmup)))
    before = _route_decisions(name)
    summary = asyncio.run(_over_http(config, lambda send: measure(send, workload, offsets)))
    remote = _route_decisions(name).get("remote", 0) - before.get("remote", 0)
    return ClusterRun(summary, remote)


class OverheadRow(NamedTuple):
    """One short prompt's TTFT, in seconds, taken apart (``router/timing.py``)."""

    in_process: float  # the idle in-process engine's TTFT, measured at its caller
    http: float  # over HTTP, at the client
    models_list: float  # GET /v1/models at the client: Serve's proxy and the router, no engine
    router_window: float  # in the router: the request's body read to the first byte out
    upstream: float  # in the router: its call to the worker pool to the first output back
    replica_engine: float  # the worker's engine: arrival to first token
    router: float  # the router's own share: router_window - upstream


def router_overhead(
    engine: AsyncLLMEngine, config: ClusterConfig, prompts: list[list[int]]
) -> list[OverheadRow]:
    """Per prompt, one after the other: its TTFT in the idle in-process engine, then over HTTP,
    with the router's timings of the HTTP request, then a ``GET /v1/models`` (no engine)."""
    in_process = offline_sender(engine, "overhead")
    name = config.models[0].name

    async def measure_all() -> list[tuple[float, float, float]]:
        rows = []
        async with OpenAIClient(f"http://127.0.0.1:{config.http_port}") as client:
            for prompt in prompts:
                item = WorkItem(prompt, 1)
                local = (await in_process(item)).ttft
                http = (await http_request(client, name, item)).ttft
                start = time.perf_counter()
                await client.models()
                rows.append((local, http, time.perf_counter() - start))
        return rows

    _take_request_timings()  # drop the earlier runs'
    measured = asyncio.run(measure_all())
    timings = _take_request_timings()
    if len(timings) != len(measured):
        raise RuntimeError(f"the router logged {len(timings)} requests, {len(measured)} were sent")
    return [
        OverheadRow(
            local,
            http,
            models_list,
            t["first_byte"] - t["body_received"],
            t["upstream_first"] - t["upstream_call"],
            t["engine_ttft"],
            t["router_seconds"],
        )
        for (local, http, models_list), t in zip(measured, timings, strict=True)
    ]


def _take_request_timings() -> list[dict]:
    from ray import serve

    from pdserve.cluster.serve import APP_NAME

    return serve.get_app_handle(APP_NAME).take_request_timings.remote().result()


def metrics_rounds(
    args: argparse.Namespace,
    ports: tuple[int, int],
    workload: list[WorkItem],
    warmup: list[WorkItem],
    offsets: list[float],
) -> dict[bool, list[Summary]]:
    """The aggregated run with metrics off and on, ``args.metrics_rounds`` times, in the order
    off-on, on-off, ...: a redeploy's old replicas may still be stopping while the next run
    starts, which must not always fall on the same side."""
    from pdserve.cluster.serve import deploy

    runs: dict[bool, list[Summary]] = {False: [], True: []}
    for round_ in range(args.metrics_rounds):
        for metrics in (False, True) if round_ % 2 == 0 else (True, False):
            config = cluster_config(args, 0, ports, metrics)
            deploy(config)
            runs[metrics].append(measure_cluster(config, workload, warmup, offsets).summary)
    return runs


def print_metrics_overhead(runs: dict[bool, list[Summary]]) -> None:
    print(
        f"\n| aggregated, {len(runs[True])} rounds of metrics off and on, alternating "
        "| output tok/s (each round) | ITL p50 ms (each round) |"
    )
    print("|---|---|---|")
    means = {}
    for metrics, summaries in runs.items():
        rates = [s.tokens_per_s for s in summaries]
        itls = [s.itl_p50 for s in summaries]
        means[metrics] = (np.mean(rates), np.mean(itls))
        print(
            f"| metrics {'on' if metrics else 'off'} | {np.mean(rates):.0f} "
            f"({', '.join(f'{r:.0f}' for r in rates)}) | {_ms(np.mean(itls))} "
            f"({', '.join(_ms(i) for i in itls)}) |"
        )
    (rate_on, itl_on), (rate_off, itl_off) = means[True], means[False]
    print(f"| on / off | {rate_on / rate_off:.3f}x | {itl_on / itl_off:.3f}x |")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def print_report(
    args: argparse.Namespace,
    workload: list[WorkItem],
    runs: dict[str, Summary],
    disaggregated: ClusterRun,
    overhead: list[OverheadRow],
    loads: tuple[float, float],
) -> None:
    prompts, outputs = [len(w.prompt) for w in workload], [w.output_len for w in workload]
    arrivals = (
        "all at once"
        if math.isinf(args.request_rate)
        else f"Poisson at {args.request_rate:g} req/s (seed {args.seed})"
    )
    print(
        f"model {args.model} (fp32), offline engine on {args.threads} torch thread(s), "
        f"replicas on {REPLICA_THREADS}; load average {loads[0]:.1f} before, {loads[1]:.1f} after"
    )
    print(
        f"{len(workload)} requests, {arrivals}; prompts {min(prompts)}-{max(prompts)} tokens "
        f"(mean {np.mean(prompts):.0f}), outputs {min(outputs)}-{max(outputs)} "
        f"(mean {np.mean(outputs):.0f}, {sum(outputs)} in all); greedy, ignore_eos"
    )
    print(
        f"disaggregated: local_prefill_max_tokens {args.local_prefill_max_tokens}, "
        f"{disaggregated.remote} of {len(workload)} prefilled remotely\n"
    )
    base = runs["offline"]
    print(
        "| run | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | output tok/s "
        "| TTFT p50 / offline | ITL p50 / offline | tok/s / offline |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, s in runs.items():
        print(
            f"| {name} | {_ms(s.ttft_p50)} | {_ms(s.ttft_p99)} | {_ms(s.itl_p50)} | "
            f"{_ms(s.itl_p99)} | {s.tokens_per_s:.0f} | {s.ttft_p50 / base.ttft_p50:.2f}x | "
            f"{s.itl_p50 / base.itl_p50:.2f}x | {s.tokens_per_s / base.tokens_per_s:.2f}x |"
        )
    col = {name: np.array([getattr(row, name) for row in overhead]) for name in OverheadRow._fields}
    verdict = "met" if np.percentile(col["router"], 50) * 1e3 < OVERHEAD_AIM_MS else "missed"
    # The cluster's added TTFT is the sum of the four parts after it (not counting the "for
    # scale" line), request by request.
    parts = {
        "TTFT over HTTP, at the client": col["http"],
        "TTFT in the in-process engine": col["in_process"],
        "cluster's added TTFT (HTTP - in-process)": col["http"] - col["in_process"],
        "HTTP proxy and client, with the body's trip to the router": (
            col["http"] - col["router_window"]
        ),
        "for scale: GET /v1/models (proxy, client and router, no engine)": col["models_list"],
        f"router's own share (aim: p50 < {OVERHEAD_AIM_MS:g} ms, {verdict})": col["router"],
        "Serve call to the worker and back": col["upstream"] - col["replica_engine"],
        "replica's engine TTFT - in-process engine TTFT": (
            col["replica_engine"] - col["in_process"]
        ),
    }
    print(
        f"\n| {len(overhead)} sequential {OVERHEAD_PROMPT_LEN}-token prompts, max_tokens 1, "
        "aggregated | p50 ms | p99 ms |"
    )
    print("|---|---|---|")
    for name, values in parts.items():
        print(f"| {name} | {_ms(np.percentile(values, 50))} | {_ms(np.percentile(values, 99))} |")
    print(
        f"\ncommand: pdserve bench cluster-latency --model {args.model} "
        f"--num-requests {args.num_requests} --max-output-len {args.max_output_len} "
        f"--request-rate {args.request_rate:g} --seed {args.seed} --threads {args.threads} "
        f"--num-kv-blocks {args.num_kv_blocks} "
        f"--local-prefill-max-tokens {args.local_prefill_max_tokens} --warmup {args.warmup} "
        f"--overhead-requests {args.overhead_requests} --metrics-rounds {args.metrics_rounds}"
    )


def run(args: argparse.Namespace) -> int:
    from pdserve.cluster.serve import deploy, free_port, start, stop

    torch.set_num_threads(args.threads)
    if not (args.model / "config.json").exists():
        from pdserve.cluster.make_model import make_model

        make_model(args.preset, args.model)
    vocab = ModelConfig.from_pretrained(args.model).vocab_size
    shape = FULL._replace(
        num_requests=args.num_requests, output_len=(FULL.output_len[0], args.max_output_len)
    )
    workload = make_workload(vocab, shape, args.seed)
    # Same shape, so the warm-up takes both paths (and sets up the KV transfer's connection).
    warmup = make_workload(vocab, shape._replace(num_requests=args.warmup), args.seed + 1)
    rng = random.Random(args.seed + 2)
    overhead_prompts = [
        [rng.randrange(vocab) for _ in range(OVERHEAD_PROMPT_LEN)]
        for _ in range(args.overhead_requests)
    ]
    offsets = arrival_offsets(len(workload), args.request_rate, args.seed)
    ports = (args.http_port or free_port(), args.grpc_port or free_port())
    configs = {name: cluster_config(args, n, ports) for name, n in CLUSTERS.items()}
    load_before = os.getloadavg()[0]
    # The replicas build their engines from the same section of the cluster config.
    engine = AsyncLLMEngine(configs["aggregated"].models[0].engine_config())
    try:
        send = offline_sender(engine, "offline")
        asyncio.run(warm_up(send, warmup))
        runs = {"offline": asyncio.run(measure(send, workload, offsets))}
        # "local": a Ray of our own, never one that `ray start` left running on this machine.
        start(configs["aggregated"], address=args.address or "local")
        try:
            aggregated = measure_cluster(configs["aggregated"], workload, warmup, offsets)
            overhead = router_overhead(engine, configs["aggregated"], overhead_prompts)
            deploy(configs["disaggregated"])  # fresh replicas: empty prefix caches
            disaggregated = measure_cluster(configs["disaggregated"], workload, warmup, offsets)
            metrics = metrics_rounds(args, ports, workload, warmup, offsets)
        finally:
            stop()
    finally:
        engine.shutdown()
    runs |= {"aggregated": aggregated.summary, "disaggregated": disaggregated.summary}
    loads = (load_before, os.getloadavg()[0])
    print_report(args, workload, runs, disaggregated, overhead, loads)
    if args.metrics_rounds:
        print_metrics_overhead(metrics)
    return 0
