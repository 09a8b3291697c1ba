"""Per-request records and the run's summary, with vLLM's ``bench serve`` definitions.

- TTFT: send to first token. E2EL: send to the stream's end.
- TPOT: ``(e2el - ttft) / (output_tokens - 1)`` per request with more than one token.
- ITL: every gap between tokens, over all requests (``latency.TokenClock``'s gaps).
- Throughputs: completed requests, output tokens, and prompt plus output tokens, per second of
  the run (its first send to its last response).
- Prefix-cache hit rate: the prompt tokens the server reports cached (its usage's
  ``cached_tokens``) over the prompt tokens of the requests it reported them for.
- Goodput: completed requests per second that met every SLO given (``--slo ttft=200,itl=50``, ms).
  A request's ``itl`` is the mean of its gaps (aiperf's per-request inter-token latency); a request
  of one token has no TPOT or ITL, and meets those SLOs.
"""

from collections import Counter
from typing import Any, NamedTuple

from pdserve.benchmarks.latency import distribution

MS = 1e3
LATENCIES = ("ttft", "tpot", "itl", "e2el")  # each summarised, and each can have an SLO


class Record(NamedTuple):
    sent_s: float  # from the run's start
    prompt_tokens: int  # the server's usage where it sent one, else the dataset's count
    output_tokens: int
    cached_tokens: int | None  # of the prompt, found in the server's prefix cache (its usage)
    max_tokens: int  # asked for
    ttft_s: float | None  # None: no token came
    itls_s: list[float]
    e2el_s: float  # to the stream's end, or to the failure
    error: str | None  # None: completed, with at least one token

    @property
    def ok(self) -> bool:
        return self.error is None

    def latency_s(self, metric: str) -> float | None:
        """This request's TTFT, TPOT, mean ITL or E2EL; None where it has none (no token, a
        failure, or one token: no TPOT or ITL)."""
        if metric == "ttft":
            return self.ttft_s
        if metric == "e2el":
            return self.e2el_s
        if not self.ok or self.output_tokens < 2 or not self.itls_s:
            return None
        if metric == "tpot":
            return (self.e2el_s - self.ttft_s) / (self.output_tokens - 1)
        return sum(self.itls_s) / len(self.itls_s)

    def row(self) -> dict[str, Any]:
        """The request in the result's JSON: its tokens, latencies in ms, gaps and error."""
        row: dict[str, Any] = {
            "sent_s": self.sent_s,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "cached_tokens": self.cached_tokens,
            "max_tokens": self.max_tokens,
        }
        for metric in LATENCIES:
            value = self.latency_s(metric)
            row[f"{metric}_ms"] = None if value is None else value * MS
        return row | {"itls_ms": [gap * MS for gap in self.itls_s], "error": self.error}


def parse_slos(text: str | None) -> dict[str, float]:
    """``"ttft=200,itl=50"`` -> {"ttft": 200.0, "itl": 50.0} (milliseconds)."""
    slos: dict[str, float] = {}
    if not text:
        return slos
    for part in text.split(","):
        name, _, value = part.partition("=")
        if name not in LATENCIES or not value:
            raise ValueError(f"an SLO is NAME=ms with NAME one of {', '.join(LATENCIES)}")
        slos[name] = float(value)
        if slos[name] <= 0:
            raise ValueError(f"an SLO must be > 0 ms, got {part!r}")
    return slos


def meets(record: Record, slos: dict[str, float]) -> bool:
    if not record.ok:
        return False
    values = {name: record.latency_s(name) for name in slos}
    return all(v is None or v * MS <= slos[name] for name, v in values.items())


def _hit_rate(done: list[Record]) -> float | None:
    """Prompt tokens served from the prefix cache over all prompt tokens, where the server said
    (its usage's ``cached_tokens``); None if it never did."""
    told = [r for r in done if r.cached_tokens is not None]
    prompt_tokens = sum(r.prompt_tokens for r in told)
    return sum(r.cached_tokens for r in told) / prompt_tokens if prompt_tokens else None


def summarize(records: list[Record], seconds: float, slos: dict[str, float]) -> dict[str, Any]:
    """The run's counts, throughputs, goodput and latency distributions (ms)."""
    done = [r for r in records if r.ok]
    inputs = sum(r.prompt_tokens for r in done)
    outputs = sum(r.output_tokens for r in done)
    summary: dict[str, Any] = {
        "completed": len(done),
        "failed": len(records) - len(done),
        "duration_s": seconds,
        "total_input_tokens": inputs,
        "total_output_tokens": outputs,
        "request_throughput": len(done) / seconds,
        "output_throughput": outputs / seconds,
        "total_token_throughput": (inputs + outputs) / seconds,
        "goodput": sum(meets(r, slos) for r in records) / seconds if slos else None,
        "prefix_cache_hit_rate": _hit_rate(done),
    }
    for metric in LATENCIES:
        if metric == "itl":  # every gap, not the per-request means
            values = [gap for r in done for gap in r.itls_s]
        else:
            values = [v for r in done if (v := r.latency_s(metric)) is not None]
        for stat, value in distribution(values)._asdict().items():
            summary[f"{stat}_{metric}_ms"] = value * MS
    summary["errors"] = dict(Counter(r.error for r in records if r.error is not None))
    return summary


def cell(value: object) -> str:
    """A summary figure in a table: counts whole, the rest to two decimals, "-" for none."""
    if value is None:
        return "-"
    return f"{value:.2f}" if isinstance(value, float) else str(value)
