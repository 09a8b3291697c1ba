"""What the planner observes: each model's last interval, read from Prometheus' HTTP API (PromQL).

Per model, over a window of ``window_s`` seconds:

- rate: requests that arrived, per second (the router's route decisions, one per request as it
  comes in): the offered load, which the requests that got their first token trail while the
  pools are overloaded (sized from those, the planner shrank a pool that was missing its target);
- ISL, OSL: prompt and generated tokens per request that got its first token (token counters
  summed over both pools, where each token counts once: ``serving/metrics.py``);
- TTFT, ITL: the histograms' means (Ray builds their ``_sum`` from bucket midpoints: close enough
  to correct a profile, not to report);
- decode batch: the requests running on a decode replica, averaged over the window.
"""

from pdserve.cluster.planner.model_planner import Observation
from pdserve.cluster.prometheus import PrometheusAPI


class PrometheusSource:
    def __init__(self, url: str) -> None:
        self.api = PrometheusAPI(url)

    def query(self, promql: str) -> dict[str, float]:
        """An instant query's value per ``model_name``; NaN and missing series are left out."""
        return self.api.by_label(promql, "model_name")

    def observe(self, models: list[str], window_s: float) -> dict[str, Observation]:
        w = f"{max(1, round(window_s))}s"

        def increase(metric: str, where: str = "") -> str:
            return f"sum by (model_name) (increase(ray_pdserve_{metric}{where}[{w}]))"

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
        batch = self.query(
            "avg by (model_name) (avg_over_time("
            f'ray_pdserve_num_requests_running{{pool="decode"}}[{w}]))'
        )
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
            )
        return seen
