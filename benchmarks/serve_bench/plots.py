"""The PNGs beside the result's JSON: latency CDFs (one curve per run), each run's per-request
timeline, and, for a sweep of request rates, throughput and goodput against the offered rate; for
``--compare``, two results' CDFs and rate curves on the same axes. matplotlib is a dev extra
(``cluster/plotting.py``): without it, no PNGs."""

import math
from pathlib import Path

import numpy as np

from pdserve.benchmarks.serve_bench.metrics import LATENCIES, MS
from pdserve.cluster.plotting import pyplot

CDF_SIZE_IN = (10, 7)
TIMELINE_WIDTH_IN, TIMELINE_HEIGHT_PER_RUN_IN = 10, 3
RATES_SIZE_IN = (10, 4)
DPI = 100


def _latencies_ms(run: dict, metric: str) -> list[float]:
    requests = [r for r in run["requests"] if r["error"] is None]
    if metric == "itl":
        return [gap for r in requests for gap in r["itls_ms"]]
    return [r[f"{metric}_ms"] for r in requests if r.get(f"{metric}_ms") is not None]


def plot_cdfs(result: dict, path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=CDF_SIZE_IN)
    for ax, metric in zip(axes.flat, LATENCIES, strict=True):
        for run in result["runs"]:
            values = np.sort(_latencies_ms(run, metric))
            if len(values):
                ax.step(values, np.arange(1, len(values) + 1) / len(values), label=run["label"])
        ax.set(xlabel=f"{metric.upper()} ms", ylabel="fraction of requests", ylim=(0, 1.02))
        ax.grid(alpha=0.3)
    if axes.flat[0].get_legend_handles_labels()[0]:  # none when every request failed
        axes.flat[0].legend(fontsize="small")
    fig.suptitle(f"{result['model']}: latency CDFs ({result['dataset']})")
    _save(plt, fig, path)


def plot_timeline(result: dict, path: Path) -> None:
    """Per request, a line from its send to its first token, then on to its end."""
    plt = pyplot()
    runs = result["runs"]
    height = TIMELINE_HEIGHT_PER_RUN_IN * len(runs)
    fig, axes = plt.subplots(len(runs), 1, figsize=(TIMELINE_WIDTH_IN, height), squeeze=False)
    for ax, run in zip(axes.flat, runs, strict=True):
        for i, r in enumerate(run["requests"]):
            end = r["sent_s"] + r["e2el_ms"] / MS
            if r["error"] is not None:
                ax.plot([r["sent_s"], end], [i, i], color="red", linewidth=1)
                continue
            first = r["sent_s"] + r["ttft_ms"] / MS  # a completed request has a first token
            ax.plot([r["sent_s"], first], [i, i], color="orange", linewidth=1)
            ax.plot([first, end], [i, i], color="steelblue", linewidth=1)
        ax.set(
            ylabel="request",
            title=f"{run['label']}: waiting + prefill (orange), decode (blue), failed (red)",
        )
        ax.yaxis.get_major_locator().set_params(integer=True)
    axes.flat[-1].set(xlabel="seconds from the run's start")
    _save(plt, fig, path)


def _rate_runs(result: dict) -> list[dict]:
    runs = [r for r in result["runs"] if r["request_rate"] is not None]
    return [r for r in runs if math.isfinite(r["request_rate"])]


def plot_rates(results: dict[str, dict], path: Path) -> bool:
    """Throughputs and goodput against the offered rate, a curve per result (keyed by its name
    in the legend, "" for one alone); False unless each is a sweep of finite rates."""
    sweeps = {name: _rate_runs(result) for name, result in results.items()}
    if any(len(runs) < 2 for runs in sweeps.values()):
        return False
    plt = pyplot()
    fig, (requests, tokens) = plt.subplots(1, 2, figsize=RATES_SIZE_IN)
    offered = sorted({r["request_rate"] for runs in sweeps.values() for r in runs})
    requests.plot(offered, offered, "k:", label="offered")
    for name, runs in sweeps.items():
        rates = [r["request_rate"] for r in runs]
        prefix = f"{name} " if name else ""
        summaries = [r["summary"] for r in runs]
        done = [s["request_throughput"] for s in summaries]
        requests.plot(rates, done, "o-", label=f"{prefix}done")
        if summaries[0]["goodput"] is not None:
            requests.plot(rates, [s["goodput"] for s in summaries], "s-", label=f"{prefix}goodput")
        for key in ("output_throughput", "total_token_throughput"):
            tokens.plot(rates, [s[key] for s in summaries], "o-", label=f"{prefix}{key}")
    requests.set(xlabel="offered requests/s", ylabel="requests/s")
    requests.legend(fontsize="small")
    tokens.set(xlabel="offered requests/s", ylabel="tokens/s")
    tokens.legend(fontsize="small")
    _save(plt, fig, path)
    return True


def _save(plt: object, fig: object, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def write_plots(result: dict, json_path: Path) -> list[Path]:
    """The PNGs written beside ``json_path`` (none without matplotlib)."""
    if pyplot() is None:
        return []
    written = [json_path.with_suffix(".cdf.png"), json_path.with_suffix(".timeline.png")]
    plot_cdfs(result, written[0])
    plot_timeline(result, written[1])
    rates = json_path.with_suffix(".rates.png")
    if plot_rates({"": result}, rates):
        written.append(rates)
    return written


def write_compare_plots(results: dict[str, dict], out: Path) -> list[Path]:
    """The compared results' CDFs (``out``.cdf.png: each run of each, labelled by the result's
    name) and, for sweeps, their rate curves (``out``.rates.png); none without matplotlib."""
    if pyplot() is None:
        return []
    merged = {
        "model": " vs ".join(results),
        "dataset": " / ".join(sorted({result["dataset"] for result in results.values()})),
        "runs": [
            {**run, "label": f"{name}: {run['label']}"}
            for name, result in results.items()
            for run in result["runs"]
        ],
    }
    written = [out.with_suffix(".cdf.png")]
    plot_cdfs(merged, written[0])
    rates = out.with_suffix(".rates.png")
    if plot_rates(results, rates):
        written.append(rates)
    return written
