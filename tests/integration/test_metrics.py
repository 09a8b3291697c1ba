"""Metrics through Ray's pipeline to a real Prometheus server, and ``GET /metrics``.

Two models on the session's cluster: one disaggregated (1 prefill + 1 decode replica), one
aggregated with a small KV cache, so a burst preempts. Before any request, ``GET /metrics`` must
show every counter series the app knows it may count (per pool, reason, route, status) at 0. A
known workload then goes through HTTP; then Prometheus' query API must return exactly its token
totals and request count per model, the KV usage must fall back to 0, and the preemptions and
prefix-cache hits the workload forced must show. Names of their own keep other modules' models,
whose series the cluster may still export, out of the sums. Every PromQL expression of the rules
and the dashboard must run and name only metrics the cluster exports.
"""

import asyncio
import json
import re
import shutil
import time
import urllib.request
from pathlib import Path
from typing import get_args

import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from pdserve.cluster.planner.planner_metrics import PlannerMetrics
from pdserve.cluster.prometheus import PrometheusAPI, PrometheusServer
from pdserve.cluster.serve import free_port
from pdserve.engine.request import RequestStatus
from pdserve.kvtransfer.stats import FailureReason
from pdserve.router.metrics import RouterMetrics
from pdserve.serving import metrics
from pdserve.serving.config import SLAConfig
from pdserve.serving.worker_metrics import WorkerMetrics
from pdserve.tests.e2e.serve_replicas import random_prompts, wait_all_free

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("prometheus") is None,
        reason="needs the prometheus binary: Debian package `prometheus` (make test installs it)",
    ),
]

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DISAGG, AGG = "metrics-disagg", "metrics-agg"
LOCAL_MAX = 32
AGG_KV_BLOCKS = 24  # 384 tokens: four 160-token requests at once do not fit
# (prompt length, max_tokens): long prompts go to the prefill pool, short ones stay local.
DISAGG_WORK = [(200, 12), (90, 5), (40, 20), (8, 6), (300, 3), (12, 9)]
AGG_WORK = [(100, 60)] * 4 + [(50, 4), (30, 11)]
REPEAT = (120, 4)  # sent twice to the aggregated model, after the burst: a prefix-cache hit
WAIT_S = 90.0
# The counters each worker replica keeps with only its model's and pool's labels.
COUNTED_PER_REPLICA = (
    "prefix_cache_queries",
    "prefix_cache_hits",
    "num_preemptions",
    "prompt_tokens",
    "generation_tokens",
    "kv_transfer_bytes",
    "kv_transfers",
    "kv_lease_expiries",
    "kv_transfer_recomputes",
)
# Where each model's prompts can prefill, and why: DISAGG has a prefill pool, AGG has none.
ROUTES = {
    DISAGG: [
        ("local", "short"),
        ("local", "cached"),
        ("local", "no_prefill_replica"),
        ("local", "saturated"),
        ("remote", "uncached"),
    ],
    AGG: [("local", "no_prefill_pool")],
}
SERIES_LABELS = {"model_name", "pool", "finished_reason", "reason", "decision", "path", "status"}
NAMES_ONLY = "metric-names"  # the model of the metrics _ours makes only to read their names


def _prompt(seed: int, length: int) -> list[int]:
    return random_prompts(seed, [length])[0]


@pytest.fixture(scope="module")
def cluster(ray_cluster, tiny_model_dir):
    models = [
        {
            "name": DISAGG,
            "path": str(tiny_model_dir),
            "engine": {"num_kv_blocks": 256},
            "routing": {"local_prefill_max_tokens": LOCAL_MAX},
        },
        {
            "name": AGG,
            "path": str(tiny_model_dir),
            "engine": {"num_kv_blocks": AGG_KV_BLOCKS},
            "prefill": {"replicas": 0},
        },
    ]
    with ray_cluster.serving(ray_cluster.config(models)) as config:
        prometheus = PrometheusServer(free_port())
        yield config, prometheus
        prometheus.stop()


async def _complete(client: openai.AsyncOpenAI, model: str, prompt: list[int], n: int) -> dict:
    response = await client.completions.create(
        model=model, prompt=prompt, max_tokens=n, extra_body={"ignore_eos": True}
    )
    return response.usage.model_dump()


async def _workload(base_url: str) -> dict[str, dict[str, int]]:
    totals = {m: {"prompt": 0, "completion": 0, "requests": 0} for m in (DISAGG, AGG)}

    def count(model: str, usage: dict) -> None:
        totals[model]["prompt"] += usage["prompt_tokens"]
        totals[model]["completion"] += usage["completion_tokens"]
        totals[model]["requests"] += 1

    async with openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0) as client:
        work = [(DISAGG, _prompt(i, n), m) for i, (n, m) in enumerate(DISAGG_WORK)]
        work += [(AGG, _prompt(100 + i, n), m) for i, (n, m) in enumerate(AGG_WORK)]
        usages = await asyncio.gather(*(_complete(client, *w) for w in work))
        for (model, _, _), usage in zip(work, usages, strict=True):
            count(model, usage)
        repeat = _prompt(200, REPEAT[0])
        for _ in range(2):
            count(AGG, await _complete(client, AGG, repeat, REPEAT[1]))
    return totals


@pytest.fixture(scope="module")
def totals(cluster) -> dict[str, dict[str, int]]:
    config, _ = cluster
    result = asyncio.run(_workload(f"http://127.0.0.1:{config.http_port}/v1"))
    wait_all_free({f"prefill-{DISAGG}": 1, f"decode-{DISAGG}": 1, f"decode-{AGG}": 1})
    return result


def _by_model(prometheus: PrometheusServer, promql: str) -> dict[str, float]:
    """The result's value per model of this module."""
    values = PrometheusAPI(prometheus.url).by_label(promql, "model_name")
    return {model: value for model, value in values.items() if model in (DISAGG, AGG)}


def _wait_for(prometheus: PrometheusServer, promql: str, want: dict[str, float]) -> None:
    deadline, got = time.monotonic() + WAIT_S, None
    while time.monotonic() < deadline:
        got = _by_model(prometheus, promql)
        if got == want:
            return
        time.sleep(1.0)
    raise AssertionError(f"{promql}: {got} != {want}")


def _declared_series(http_url: str) -> set[tuple[str, frozenset]]:
    """Each counter series of this module's app known before any request: (name, labels)."""
    series: set[tuple[str, frozenset]] = set()

    def add(name: str, **labels: str) -> None:
        series.add((f"ray_pdserve_{name}_total", frozenset(labels.items())))

    for model, pool in ((DISAGG, "prefill"), (DISAGG, "decode"), (AGG, "decode")):
        for name in COUNTED_PER_REPLICA:
            add(name, model_name=model, pool=pool)
        for status in RequestStatus:
            if status.finished:
                add("request_success", model_name=model, pool=pool, finished_reason=status.value)
        for reason in get_args(FailureReason):
            add("kv_transfer_failures", model_name=model, pool=pool, reason=reason)
    for model, routes in ROUTES.items():
        add("request_migrations", model_name=model)
        for decision, reason in routes:
            add("route_decisions", model_name=model, decision=decision, reason=reason)
            add("route_cached_tokens", model_name=model, decision=decision)
    with urllib.request.urlopen(f"{http_url}/openapi.json", timeout=10) as response:
        document = json.load(response)
    for path, operations in document["paths"].items():
        for operation in operations.values():
            for status in operation["responses"]:
                add("http_responses", path=path, status=status)
    add("http_responses", path="other", status="404")
    return series


def _counter_samples(http_url: str) -> dict[tuple[str, frozenset], list[float]]:
    """``GET /metrics``' counter samples, by name and the labels ``_declared_series`` names."""
    with urllib.request.urlopen(f"{http_url}/metrics", timeout=10) as response:
        page = response.read().decode()
    samples: dict[tuple[str, frozenset], list[float]] = {}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            if sample.name.endswith("_total"):
                labels = {k: v for k, v in sample.labels.items() if k in SERIES_LABELS}
                key = (sample.name, frozenset(labels.items()))
                samples.setdefault(key, []).append(sample.value)
    return samples


def test_every_counter_is_at_zero_before_any_request(cluster):
    # First in the module: `totals` has sent no request yet. Each worker counter per pool, finished
    # and failure reason; the router's per route and per documented status; at 0, not missing.
    config, _ = cluster
    http_url = f"http://127.0.0.1:{config.http_port}"
    declared = _declared_series(http_url)
    assert {name for name, _ in declared} == {n for n in _ours() if n.endswith("_total")}
    deadline = time.monotonic() + WAIT_S
    while (missing := declared - _counter_samples(http_url).keys()) and time.monotonic() < deadline:
        time.sleep(1.0)
    assert not missing
    samples = _counter_samples(http_url)
    read = (
        "ray_pdserve_http_responses_total",
        frozenset({"path": "/metrics", "status": "200"}.items()),
    )
    # Another module's router may have counted the same path and status before: ours is at 0.
    nonzero = {key: samples[key] for key in declared - {read} if min(samples[key]) != 0}
    assert not nonzero


def test_prometheus_has_the_workload_totals(cluster, totals):
    _, prometheus = cluster
    want = {m: float(t["prompt"]) for m, t in totals.items()}
    assert want[DISAGG] == sum(n for n, _ in DISAGG_WORK)  # usage counts the prompt as sent
    _wait_for(prometheus, "sum by (model_name) (ray_pdserve_prompt_tokens_total)", want)
    want = {m: float(t["completion"]) for m, t in totals.items()}
    _wait_for(prometheus, "sum by (model_name) (ray_pdserve_generation_tokens_total)", want)
    want = {m: float(t["requests"]) for m, t in totals.items()}
    ttft_count = "sum by (model_name) (ray_pdserve_time_to_first_token_seconds_count)"
    _wait_for(prometheus, ttft_count, want)
    _wait_for(
        prometheus, "max by (model_name) (ray_pdserve_kv_cache_usage_perc)", {DISAGG: 0, AGG: 0}
    )


def test_each_worker_logs_its_stats_line(ray_cluster, cluster, totals):
    # On the replicas' stderr, which Ray keeps in worker-*.err and shows on the driver.
    deadline = time.monotonic() + WAIT_S
    for pool, model in (("prefill", DISAGG), ("decode", DISAGG), ("decode", AGG)):
        pattern = re.compile(rf"{pool}-{model} \w+: prompt [\d.]+ tok/s, generation [\d.]+ tok/s")
        while not any(pattern.search(f.read_text()) for f in ray_cluster.log_dir.glob("*.err")):
            assert time.monotonic() < deadline, f"no stats line from {pool}-{model}"
            time.sleep(1.0)


def test_forced_preemptions_and_prefix_hits_show(cluster, totals):
    _, prometheus = cluster
    deadline = time.monotonic() + WAIT_S
    while True:
        preempted = _by_model(prometheus, "sum by (model_name) (ray_pdserve_num_preemptions_total)")
        hits = _by_model(prometheus, "sum by (model_name) (ray_pdserve_prefix_cache_hits_total)")
        if preempted.get(AGG, 0) > 0 and hits.get(AGG, 0) >= REPEAT[0] // 16 * 16 - 16:
            break
        assert time.monotonic() < deadline, (preempted, hits)
        time.sleep(1.0)
    remote = _by_model(
        prometheus, 'sum by (model_name) (ray_pdserve_route_decisions_total{decision="remote"})'
    )
    assert remote[DISAGG] == sum(n >= LOCAL_MAX for n, _ in DISAGG_WORK)


def test_metrics_page_parses_and_matches_the_usage(cluster, totals):
    config, _ = cluster
    url = f"http://127.0.0.1:{config.http_port}/metrics"
    deadline = time.monotonic() + WAIT_S
    while True:
        with urllib.request.urlopen(url, timeout=10) as response:
            page = response.read().decode()
        sums: dict[tuple[str, str], float] = {}
        for family in text_string_to_metric_families(page):
            assert family.name.startswith("ray_pdserve_"), family.name
            for sample in family.samples:
                if sample.labels.get("model_name") in (DISAGG, AGG) and sample.name in (
                    "ray_pdserve_prompt_tokens_total",
                    "ray_pdserve_generation_tokens_total",
                ):
                    key = (sample.name, sample.labels["model_name"])
                    sums[key] = sums.get(key, 0.0) + sample.value
        want = {}
        for model, t in totals.items():
            want["ray_pdserve_prompt_tokens_total", model] = float(t["prompt"])
            want["ray_pdserve_generation_tokens_total", model] = float(t["completion"])
        if sums == want:
            return
        assert time.monotonic() < deadline, (sums, want)
        time.sleep(1.0)


def _expressions() -> list[str]:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "rules.yml").read_text())
    exprs = [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    dashboard = json.loads((DEPLOY / "grafana" / "pdserve.json").read_text())
    for panel in dashboard["panels"]:
        exprs += [target["expr"] for target in panel.get("targets", [])]
    return exprs


def _names(expr: str) -> set[str]:
    # Metric names: ray_* series, our recording rules (pdserve:...), and Prometheus' own `up`.
    return set(re.findall(r"\b(ray_[a-z_]+|pdserve:[a-z0-9_:]+|up)\b(?!\s*\()", expr))


def _ours() -> set[str]:
    """The names of every metric pdserve makes (made here, in the test's Ray driver)."""
    WorkerMetrics(NAMES_ONLY, "decode", "test", 2048, "nixl")
    RouterMetrics()
    PlannerMetrics()
    return set(metrics.EXPORTED_NAMES)


def test_every_rule_and_panel_expression_runs_on_exported_metrics(cluster, totals):
    _, prometheus = cluster
    api = PrometheusAPI(prometheus.url)
    scraped = api.metric_names()
    ours = _ours()
    assert {n for n in scraped if n.startswith("ray_pdserve_")} <= ours
    rules = yaml.safe_load((DEPLOY / "prometheus" / "rules.yml").read_text())
    recorded = {r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r}
    dashboard_vars = {"$model": DISAGG, "$pool": "decode", "$__rate_interval": "1m"}
    for expr in _expressions():
        for name in _names(expr):
            # Ours (scraped once it has a value), a recording rule, or Ray's and Prometheus' own.
            assert name in ours | recorded | scraped, (name, expr)
        for variable, value in dashboard_vars.items():
            expr = expr.replace(variable, value)
        api.query(expr)  # a bad expression fails the query


def test_the_targets_stay_exported_long_after_they_were_set(cluster, totals):
    # Set once, when the router starts: each must be in (about) every scrape of the last 30 s (6,
    # at Prometheus' 5 s), where Ray drops a gauge not set again within a report or two. Last in
    # the module, so that most of those 30 s have passed in the other tests.
    _, prometheus = cluster
    targets = SLAConfig()
    for name, value in (("ttft", targets.ttft_ms), ("itl", targets.itl_ms)):
        series = f"ray_pdserve_sla_{name}_seconds"
        _wait_for(
            prometheus, f"max by (model_name) ({series})", {DISAGG: value / 1e3, AGG: value / 1e3}
        )
        scrapes = f"min by (model_name) (count_over_time({series}[30s]))"
        deadline = time.monotonic() + WAIT_S
        while not (
            (got := _by_model(prometheus, scrapes)).keys() == {DISAGG, AGG}
            and min(got.values()) >= 5
        ):
            assert time.monotonic() < deadline, (series, got)
            time.sleep(1.0)
