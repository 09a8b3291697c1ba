"""``pdserve bench ramp``: a load that steps through rates against a serving pdserve whose SLA
planner is on, and what the planner did about it.

Requests (new random prompts of ``--input-len`` tokens, ``--output-len`` out, streamed) are sent
as a Poisson process whose rate steps through ``--stages`` (``rate:seconds,...``). Every
``--sample-s`` the planner's target and the running replicas per pool are read from Prometheus
(``ray_pdserve_planner_target_replicas``, ``ray_pdserve_pool_running_replicas``), and the model's
targets from its SLA gauges. Writes ``--out`` (JSON: every request's send time, TTFT and ITLs, the
samples, and per window of ``--window-s`` the offered rate and TTFT/ITL p95) and a PNG beside it
over time: offered rate, replicas per pool, TTFT and ITL p95 against the targets.
"""

import argparse
import asyncio
import contextlib
import json
import random
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np

from pdserve.benchmarks.arrivals import Stage, parse_stages, send_times
from pdserve.benchmarks.latency import Timing
from pdserve.benchmarks.openai_http import OpenAIClient
from pdserve.benchmarks.stream_timing import http_request
from pdserve.benchmarks.workload import WorkItem
from pdserve.cluster.plotting import pyplot
from pdserve.cluster.prometheus import PrometheusAPI, local_url
from pdserve.serving.config import DEFAULT_PROMETHEUS_PORT

POOLS = ("prefill", "decode")


class Sent(NamedTuple):
    at: float  # seconds from the run's start
    timing: Timing | None  # None: the request failed
    error: str | None


def windows(sent: list[Sent], seconds: float, window_s: float) -> list[dict]:
    """Per window of the run: requests sent, the offered rate, and TTFT/ITL p95 (ms) of the
    requests sent in it (None where none completed)."""
    rows = []
    for start in np.arange(0.0, seconds, window_s):
        inside = [s for s in sent if start <= s.at < start + window_s]
        done = [s.timing for s in inside if s.timing is not None]
        gaps = [gap for t in done for gap in t.itls]
        rows.append(
            {
                "start_s": float(start),
                "sent": len(inside),
                "rate": len(inside) / window_s,
                "ttft_p95_ms": float(np.percentile([t.ttft for t in done], 95) * 1e3)
                if done
                else None,
                "itl_p95_ms": float(np.percentile(gaps, 95) * 1e3) if gaps else None,
            }
        )
    return rows


def _by_pool(prometheus: PrometheusAPI, metric: str, model: str) -> dict[str, float]:
    return prometheus.by_label(f'{metric}{{model_name="{model}"}}', "pool")


def _sla_ms(prometheus: PrometheusAPI, model: str) -> dict[str, float | None]:
    """The model's targets as the router exports them (None before it has)."""
    targets = {}
    for name in ("ttft", "itl"):
        series = prometheus.query(f'ray_pdserve_sla_{name}_seconds{{model_name="{model}"}}')
        targets[name] = series[0].value * 1e3 if series else None
    return targets


async def _sample(args: argparse.Namespace, start: float, until: asyncio.Event) -> list[dict]:
    prometheus, samples = PrometheusAPI(args.prometheus), []
    while not until.is_set():
        row = {"at": time.perf_counter() - start}
        for key, metric in (
            ("target", "ray_pdserve_planner_target_replicas"),
            ("running", "ray_pdserve_pool_running_replicas"),
        ):
            row[key] = await asyncio.to_thread(_by_pool, prometheus, metric, args.model)
        samples.append(row)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(until.wait(), args.sample_s)
    return samples


async def _run_load(
    args: argparse.Namespace, stages: list[Stage], vocab: int
) -> tuple[list[Sent], list[dict], float]:
    offsets = send_times(stages, args.seed)
    rng = random.Random(args.seed + 1)
    items = [
        WorkItem([rng.randrange(vocab) for _ in range(args.input_len)], args.output_len)
        for _ in offsets
    ]
    start, done = time.perf_counter(), asyncio.Event()
    sampler = asyncio.ensure_future(_sample(args, start, done))
    async with OpenAIClient(args.url) as client:

        async def one(offset: float, item: WorkItem) -> Sent:
            await asyncio.sleep(start + offset - time.perf_counter())
            try:
                return Sent(offset, await http_request(client, args.model, item), None)
            except Exception as error:  # counted and reported: the run goes on
                return Sent(offset, None, repr(error))

        sent = await asyncio.gather(*map(one, offsets, items))
        # Load over: keep sampling while the planner shrinks the pools again.
        await asyncio.sleep(args.cooldown_s)
    done.set()
    return list(sent), await sampler, time.perf_counter() - start


def _request_row(sent: Sent) -> dict:
    if sent.timing is None:
        return {"at": sent.at, "error": sent.error}
    return {"at": sent.at, "ttft": sent.timing.ttft, "itls": sent.timing.itls}


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def plot(result: dict, path: Path) -> bool:
    """Offered rate, replicas per pool and TTFT/ITL p95 over time; False without matplotlib."""
    plt = pyplot()
    if plt is None:
        return False
    fig, (load, replicas, ttft, itl) = plt.subplots(4, 1, figsize=(9, 10), sharex=True)
    rows = result["windows"]
    at = [w["start_s"] for w in rows]
    load.step(at, [w["rate"] for w in rows], where="post", label="offered")
    load.set(ylabel="requests/s", title=f"{result['model']}: {result['command']}")
    for pool in POOLS:
        samples = result["samples"]
        times = [s["at"] for s in samples]
        target = [s["target"].get(pool, np.nan) for s in samples]
        running = [s["running"].get(pool, np.nan) for s in samples]
        replicas.step(times, target, where="post", label=f"{pool} target")
        replicas.plot(times, running, "o", markersize=3, label=f"{pool} running")
    replicas.set(ylabel="replicas")
    replicas.legend(loc="upper right", fontsize="small")
    for axes, key, name in ((ttft, "ttft_p95_ms", "ttft"), (itl, "itl_p95_ms", "itl")):
        p95 = [np.nan if w[key] is None else w[key] for w in rows]
        axes.plot(at, p95, marker="o", markersize=3, label="p95")
        if result["targets_ms"][name] is not None:
            axes.axhline(result["targets_ms"][name], color="red", linestyle="--", label="target")
        axes.set(ylabel=f"{name.upper()} p95 ms", yscale="log")
        axes.legend(loc="upper right", fontsize="small")
    itl.set(xlabel="seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the server (no /v1)")
    parser.add_argument("--prometheus", default=local_url(DEFAULT_PROMETHEUS_PORT))
    parser.add_argument("--model", default="tiny", help="the served model's name")
    parser.add_argument("--vocab-size", type=int, default=4096, help="prompt token ids below it")
    parser.add_argument("--stages", default="1:60,6:60,1:60", help="rate:seconds,... (req/s)")
    parser.add_argument("--input-len", type=int, default=512, help="prompt tokens")
    parser.add_argument("--output-len", type=int, default=64, help="max_tokens")
    parser.add_argument("--cooldown-s", type=float, default=60.0, help="sampling after the load")
    parser.add_argument("--sample-s", type=float, default=2.0, help="Prometheus reads")
    parser.add_argument("--window-s", type=float, default=10.0, help="per-window latencies")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("ramp.json"))


def run(args: argparse.Namespace) -> int:
    stages = parse_stages(args.stages)
    sent, samples, seconds = asyncio.run(_run_load(args, stages, args.vocab_size))
    failed = [s.error for s in sent if s.error is not None]
    result = {
        "model": args.model,
        "command": f"pdserve bench ramp --stages {args.stages} --input-len {args.input_len} "
        f"--output-len {args.output_len} --seed {args.seed}",
        "stages": [s._asdict() for s in stages],
        "targets_ms": _sla_ms(PrometheusAPI(args.prometheus), args.model),
        "requests": [_request_row(s) for s in sent],
        "samples": samples,
        "windows": windows(sent, seconds, args.window_s),
    }
    args.out.write_text(json.dumps(result, indent=1))
    print(f"{len(sent)} requests, {len(failed)} failed, over {seconds:.0f} s; wrote {args.out}")
    print("| window s | offered req/s | TTFT p95 ms | ITL p95 ms | replicas (prefill, decode) |")
    print("|---|---|---|---|---|")
    for row in result["windows"]:
        during = [s for s in samples if row["start_s"] <= s["at"] < row["start_s"] + args.window_s]
        most = {pool: max((s["running"].get(pool, 0) for s in during), default=0) for pool in POOLS}
        print(
            f"| {row['start_s']:.0f} | {row['rate']:.1f} | {_ms(row['ttft_p95_ms'])} "
            f"| {_ms(row['itl_p95_ms'])} | {most['prefill']:.0f}, {most['decode']:.0f} |"
        )
    png = args.out.with_suffix(".png")
    if plot(result, png):
        print(f"plotted {png}")
    return 1 if failed else 0
