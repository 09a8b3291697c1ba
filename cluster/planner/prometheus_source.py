"""What the planner observes: each model's last interval, read from Prometheus' HTTP API (PromQL).

Per model, over a window of ``window_s`` seconds:

- rate: requests that arrived, per second (the router's route decisions, one per request as it
  comes in): the offered load, which the requests that got their first token trail while the
  pools are overloaded (sized from those, the planner shrank a pool that was missing its target);
- ISL, OSL: prompt and generated tokens per request that got its first token (token counters
  summed over both pools, where each token counts once: ``serving/metrics.py``);
- TTFT, ITL: the histograms' means (Ray builds their ``_sum`` from bucket midpoints: close enough
  to correct a profile, not to report);
- decode batch: the requests running on a decode replica, averaged over the window;
- decode room: the fullest decode replica's KV usage and the requests waiting on the decode
  replicas, averaged over the window (``sizing.decode_at_capacity``);
- prefill queue: the prompts on each prefill replica (running and waiting, averaged over the
  window) beyond the one it prefills, summed over the pool (``sizing.prefill_at_capacity``).

Before those, ``ages`` says whether there is anything to read (``data_health.py``): how old the
newest sample is of series each model exports whatever its load.
"""

from pdserve.cluster.planner.model_planner import Observation
from pdserve.cluster.prometheus import PrometheusAPI

# The router's SLA target, a gauge it holds (serving/metrics.py: HeldGauges): the arrivals and
# latencies come from the router. Counters would not do: one appears only once a request counts.
ROUTER_SERIES = "ray_pdserve_sla_ttft_seconds"
# Requests running, which every replica of either pool sets each second: the tokens come from
# the pools.
POOL_SERIES = "ray_pdserve_num_requests_running"
ROUTER = "router"  # the source the router's series is named by, beside the pools'


class PrometheusSource:
    def __init__(self, url: str) -> None:
        self.api = PrometheusAPI(url)

    def query(self, promql: str) -> dict[str, float]:
        """An instant query's value per ``model_name``; NaN and missing series are left out."""
        return self.api.by_label(promql, "model_name")

    def ages(self) -> dict[tuple[str, str], float]:
        """Per (model, source), how old the newest sample of the source's live series is, on
        Prometheus' clock; the source is ``ROUTER`` or a pool. What Prometheus does not hold, or
        has marked stale (its target stopped answering), is absent."""
        router = self.api.sample_ages(ROUTER_SERIES, ("model_name",))
        pools = self.api.sample_ages(POOL_SERIES, ("model_name", "pool"))
        return {(model, ROUTER): age for (model,), age in router.items()} | pools

    def observe(self, models: list[str], window_s: float) -> dict[str, Observation]:
        w = f"{max(1, round(window_s))}s"

        def increase(metric: str, where: str = "") -> str:
            return f"sum by (model_name) (increase(ray_pdserve_{metric}{where}[{w}]))"

        def mean(metric: str, pool: str) -> str:  # per replica, over the window
            return f'avg_over_time(ray_pdserve_{metric}{{pool="{pool}"}}[{w}])'

        def pool_mean(metric: str, across: str) -> str:
            return f"{across} by (model_name) ({mean(metric, 'decode')})"

        arrivals = self.query(increase("route_decisions_total"))
        requests = self.query(increase("time_to_first_token_seconds_count"))
        prompt = self.query(increase("prompt_tokens_total"))
        generated = self.query(increase("generation_tokens_total"))
        ttft = self.query(
            f"{increase('time_to_first_token_seconds_sum')} / "
            f"{increase('time_to_first_token_seconds_count')}"
        )
        itl = self.query(
            f"{increase('inter_token_latency_seconds_sum')} / "
            f"{increase('inter_token_latency_seconds_count')}"
        )
        batch = self.query(pool_mean("num_requests_running", "avg"))
        kv_usage = self.query(pool_mean("kv_cache_usage_perc", "max"))
        waiting = self.query(pool_mean("num_requests_waiting", "sum"))
        # A prefill replica's prompts beyond the one it prefills; it batches all that fit its token
        # budget into one step, so a queue shows as running before it shows as waiting.
        prompts = " + ".join(
            mean(m, "prefill") for m in ("num_requests_running", "num_requests_waiting")
        )
        prefill_queued = self.query(f"sum by (model_name) (clamp_min({prompts} - 1, 0))")
        seen = {}
        for model in models:
            n = requests.get(model, 0.0)
            seen[model] = Observation(
                rate=arrivals.get(model, 0.0) / window_s,
                isl=prompt.get(model, 0.0) / n if n else None,
                osl=generated.get(model, 0.0) / n if n else None,
                ttft_s=ttft.get(model),
                itl_s=itl.get(model),
                decode_batch=batch.get(model),
                decode_kv_usage=kv_usage.get(model),
                decode_waiting=waiting.get(model),
                prefill_queued=prefill_queued.get(model),
            )
        return seen
