"""``pdserve bench serve --compare a.json b.json``: each summary figure of b over a's, run by run
(a sweep's runs paired in order); and ``--models``' pooled summaries, each model over the first."""

import json
import math
from pathlib import Path

from pdserve.benchmarks.serve_bench.metrics import cell


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def compare_table(a: dict, b: dict) -> list[str]:
    """Markdown rows: run, metric, a, b, b / a, for every finite number both summaries hold."""
    lines = ["| run | metric | a | b | b / a |", "|---|---|---|---|---|"]
    for run_a, run_b in zip(a["runs"], b["runs"], strict=False):
        label = (
            run_a["label"]
            if run_a["label"] == run_b["label"]
            else (f"{run_a['label']} vs {run_b['label']}")
        )
        for metric, value_a in run_a["summary"].items():
            value_b = run_b["summary"].get(metric)
            if not (_number(value_a) and _number(value_b)):
                continue
            lines.append(
                f"| {label} | {metric} | {cell(value_a)} | {cell(value_b)} | "
                f"{_ratio(value_b, value_a)} |"
            )
    return lines


def pooled_table(pooled: dict[str, dict]) -> list[str]:
    """Markdown rows: metric, each model's figure, then each later model's over the first's."""
    (first, base), *others = pooled.items()
    lines = [
        "| metric | " + " | ".join(pooled) + "".join(f" | {m} / {first}" for m, _ in others) + " |",
        "|---" * (1 + len(pooled) + len(others)) + "|",
    ]
    for metric, value in base.items():
        values = [summary.get(metric) for summary in pooled.values()]
        if not all(_number(v) for v in values):
            continue
        ratios = "".join(f" | {_ratio(v, value)}" for v in values[1:])
        lines.append(f"| {metric} | " + " | ".join(cell(v) for v in values) + ratios + " |")
    return lines


def _ratio(value: float, base: float) -> str:
    return f"{value / base:.3f}x" if base else "-"  # no ratio over zero


def _what(result: dict) -> str:
    return f"{result['model']} over {result['backend']}, dataset {result['dataset']}"


def load_pair(a: Path, b: Path) -> dict[str, dict]:
    """Both results, a's first, by the names their plots give them: the files' names, or
    "a NAME" and "b NAME" when the two are the same."""
    names = (a.stem, b.stem) if a.stem != b.stem else (f"a {a.stem}", f"b {b.stem}")
    return {name: json.loads(path.read_text()) for name, path in zip(names, (a, b), strict=True)}


def compare_files(a: Path, b: Path, results: dict[str, dict]) -> list[str]:
    """The report on ``results`` (``load_pair(a, b)``): which file is which, then the table."""
    first, second = results.values()
    lines = [
        f"{name}: {path} ({_what(result)})"
        for name, path, result in (("a", a, first), ("b", b, second))
    ]
    lines.append("")
    if len(first["runs"]) != len(second["runs"]):
        lines.insert(
            2,
            f"runs: {len(first['runs'])} in a, {len(second['runs'])} in b; "
            "the first of each compared in order",
        )
    return lines + compare_table(first, second)
