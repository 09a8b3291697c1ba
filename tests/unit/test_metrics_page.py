"""``GET /metrics``'s page: the nodes' pdserve families joined, one HELP/TYPE each; and vLLM's
token buckets."""

from prometheus_client.parser import text_string_to_metric_families

from pdserve.router.api.metrics_endpoint import merge_families, render
from pdserve.serving.metrics import one_two_five_buckets


def _node_page(node: str, tokens: float, ttft_count: float) -> str:
    labels = f'NodeAddress="{node}",model_name="tiny"'
    return f"""# HELP ray_pdserve_prompt_tokens_total Prefill tokens processed.
# TYPE ray_pdserve_prompt_tokens_total counter
ray_pdserve_prompt_tokens_total{{{labels}}} {tokens}
# HELP ray_pdserve_time_to_first_token_seconds Time to first token in seconds.
# TYPE ray_pdserve_time_to_first_token_seconds histogram
ray_pdserve_time_to_first_token_seconds_bucket{{{labels},le="0.1"}} {ttft_count}
ray_pdserve_time_to_first_token_seconds_bucket{{{labels},le="+Inf"}} {ttft_count}
ray_pdserve_time_to_first_token_seconds_count{{{labels}}} {ttft_count}
ray_pdserve_time_to_first_token_seconds_sum{{{labels}}} 0.05
# HELP ray_gcs_update_resource_usage_time Ray's own.
# TYPE ray_gcs_update_resource_usage_time gauge
ray_gcs_update_resource_usage_time{{{labels}}} 3.0
"""


def test_the_nodes_families_are_joined_and_others_dropped() -> None:
    page = render(merge_families([_node_page("a", 10, 2), _node_page("b", 32, 5), ""])).decode()
    assert page.count("# TYPE ray_pdserve_prompt_tokens_total counter") == 1
    assert "ray_gcs" not in page
    families = {f.name: f for f in text_string_to_metric_families(page)}
    assert set(families) == {"ray_pdserve_prompt_tokens", "ray_pdserve_time_to_first_token_seconds"}
    tokens = families["ray_pdserve_prompt_tokens"].samples
    assert sorted(s.value for s in tokens) == [10, 32]
    counts = [
        s.value
        for s in families["ray_pdserve_time_to_first_token_seconds"].samples
        if s.name.endswith("_count")
    ]
    assert sorted(counts) == [2, 5]


def test_token_buckets_are_vllms() -> None:
    assert one_two_five_buckets(100) == [1, 2, 5, 10, 20, 50, 100]
    assert one_two_five_buckets(4096)[-3:] == [500, 1000, 2000]
