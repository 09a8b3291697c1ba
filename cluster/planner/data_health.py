"""Whether the planner may act on what Prometheus shows of a model: it fails safe.

Read as zeros, missing data looks like no load, and the planner would shrink both pools to their
minimum under load. So a model's counts hold, neither up nor down, while Prometheus does not
answer, holds none of the series the model always exports (a new scrape config, a relabel, a
Prometheus just started, a node it does not scrape), or holds only samples older than the
planner's window. Freshness is judged on Prometheus' clock alone: each series' newest sample
against the evaluation time of the same answer (``PrometheusSource.ages``), never against the
planner's clock, which may differ.

The series are the router's (always) and those of each pool that has replicas now: a pool at
zero exports nothing, and waiting for it would hold it at zero for good.
"""

import logging
from typing import Literal, NamedTuple

from pdserve.cluster.planner.prometheus_source import ROUTER

Kind = Literal["unreachable", "no series", "stale"]


class Problem(NamedTuple):
    kind: Kind
    detail: str  # for the log line: which series, how old, or the error


def data_problem(
    ages: dict[tuple[str, str], float], model: str, sources: list[str], window_s: float
) -> Problem | None:
    """What keeps ``model``'s data from being used, given the ages of its ``sources``' newest
    samples (``PrometheusSource.ages``); None when every one is younger than the window."""
    missing = [source for source in sources if (model, source) not in ages]
    if missing:
        return Problem("no series", f"Prometheus holds no series of its {', '.join(missing)}")
    oldest = max(sources, key=lambda source: ages[model, source])
    if ages[model, oldest] > window_s:
        return Problem(
            "stale",
            f"the newest sample of its {oldest} is {ages[model, oldest]:.0f} s old, over the "
            f"{window_s:.0f} s window",
        )
    return None


def live_sources(counts: tuple[int, int]) -> list[str]:
    """The sources whose series must be fresh, given the (prefill, decode) replicas now."""
    pools = [pool for pool, n in zip(("prefill", "decode"), counts, strict=True) if n > 0]
    return [ROUTER, *pools]


class DataHealth:
    """Each model's data as last found, with one log line each time that changes: when it goes
    missing (naming why) and when it returns, not every interval in between."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._kinds: dict[str, Kind | None] = {}  # None: usable; a model not seen yet counts so

    def update(self, model: str, problem: Problem | None, counts: tuple[int, int]) -> bool:
        """Whether ``model``'s data may be planned from now; ``counts``: its (prefill, decode)
        replicas, which a hold keeps."""
        kind = None if problem is None else problem.kind
        if kind != self._kinds.get(model):
            if problem is None:
                self._logger.info("planner: %s: data is back; planning resumes", model)
            else:
                self._logger.warning(
                    "planner: %s: holding prefill %d, decode %d: %s (%s)",
                    model,
                    *counts,
                    problem.detail,
                    problem.kind,
                )
        self._kinds[model] = kind
        return problem is None
