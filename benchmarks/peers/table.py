"""``bench peers``' result as a table and a plot: each concurrency's figures for both servers, and
pdserve's over llama.cpp's."""

from pathlib import Path

from pdserve.benchmarks.serve_bench.metrics import cell
from pdserve.cluster.plotting import pyplot

OURS, PEER = "pdserve", "llama.cpp"
# (summary key, heading): what the aims are stated in
FIGURES = (
    ("output_throughput", "out tok/s"),
    ("p50_ttft_ms", "TTFT p50 ms"),
    ("p50_itl_ms", "ITL p50 ms"),
    ("p90_itl_ms", "ITL p90 ms"),
)


def _ratio(ours: float, peer: float) -> str:
    return f"{ours / peer:.2f}x" if peer else "-"


def peers_table(by_concurrency: dict[str, dict[str, dict]]) -> list[str]:
    """Markdown rows from ``{concurrency: {server: summary}}``: both servers' figures and
    failures, then a row of pdserve / llama.cpp for each figure."""
    headings = [heading for _, heading in FIGURES]
    lines = [
        "| concurrency | server | " + " | ".join(headings) + " | completed | failed |",
        "|---" * (len(FIGURES) + 4) + "|",
    ]
    for concurrency, summaries in by_concurrency.items():
        for server in (PEER, OURS):
            summary = summaries[server]
            figures = [cell(summary[key]) for key, _ in FIGURES]
            counts = [str(summary["completed"]), str(summary["failed"])]
            lines.append(f"| {concurrency} | {server} | " + " | ".join(figures + counts) + " |")
        ratios = [_ratio(summaries[OURS][key], summaries[PEER][key]) for key, _ in FIGURES]
        lines.append(f"| {concurrency} | {OURS} / {PEER} | " + " | ".join(ratios) + " | | |")
    return lines


def plot_peers(by_concurrency: dict[str, dict[str, dict]], path: Path) -> bool:
    """Throughput, TTFT p50 and ITL p50 against concurrency, one line per server; False without
    matplotlib."""
    plt = pyplot()
    if plt is None:
        return False
    levels = list(by_concurrency)
    fig, axes = plt.subplots(1, len(FIGURES) - 1, figsize=(12, 3.5))
    for ax, (key, heading) in zip(axes, FIGURES[:3], strict=True):
        for server in (PEER, OURS):
            ax.plot(levels, [by_concurrency[c][server][key] for c in levels], "o-", label=server)
        ax.set_xlabel("concurrency")
        ax.set_title(heading)
    axes[0].legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
