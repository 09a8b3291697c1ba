"""The deployment config: defaults, validation with named errors, YAML, and the engine config."""

from pathlib import Path

import pydantic
import pytest

from pdserve.serving.config import ClusterConfig, PlannerConfig, PoolConfig, RouterConfig


def _model(**overrides) -> dict:
    return {"name": "tiny", "path": "/models/tiny", **overrides}


def test_defaults_serve_one_prefill_and_one_decode_replica() -> None:
    config = ClusterConfig(models=[_model()])
    (model,) = config.models
    assert (model.prefill.replicas, model.decode.replicas) == (1, 1)
    assert model.disaggregated and model.routing.policy == "kv_aware"
    assert (config.http_port, config.grpc_port) == (8000, 9000)
    assert model.kv_transfer.backend == "auto" and model.kv_transfer.lease_seconds == 30.0
    # Serve's own default (5 calls in flight per replica) would cap the engine's batch.
    assert model.decode.max_ongoing_requests == 256 and config.router.max_ongoing_requests > 256
    assert (config.router.replicas, config.router.autoscaled) == (1, False)


def test_zero_prefill_replicas_is_aggregated() -> None:
    (model,) = ClusterConfig(models=[_model(prefill={"replicas": 0})]).models
    assert not model.disaggregated


def test_engine_section_builds_the_engine_config() -> None:
    (model,) = ClusterConfig(models=[_model(engine={"num_kv_blocks": 64, "block_size": 32})]).models
    engine = model.engine_config()
    assert (engine.model, engine.num_kv_blocks, engine.block_size) == ("/models/tiny", 64, 32)


@pytest.mark.parametrize(
    ("models", "named"),
    [
        ([_model(engine={"num_kv_block": 64})], "unknown engine args: num_kv_block"),
        ([_model(prefill={"replicas": -1})], "replicas"),
        ([_model(decode={"cpus": [0, -1]})], "cpus"),
        ([_model(routing={"policy": "random"})], "policy"),
        ([_model(kv_transfer={"backend": "tcp"})], "backend"),
        ([_model(), _model()], "model names must be unique"),
        ([_model(surprise=1)], "surprise"),
        ([], "models"),
    ],
)
def test_bad_configs_are_refused_naming_the_field(models: list, named: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=named):
        ClusterConfig(models=models)


def test_yaml_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(
        "models:\n"
        "  - name: tiny\n"
        "    path: /models/tiny\n"
        "    decode: {replicas: 2, resources: {decode_node: 1}}\n"
        "    routing: {local_prefill_max_tokens: 256}\n"
        "http_port: 8100\n"
    )
    config = ClusterConfig.from_yaml(path)
    (model,) = config.models
    assert model.decode.replicas == 2 and model.decode.resources == {"decode_node": 1}
    assert model.routing.local_prefill_max_tokens == 256 and config.http_port == 8100


def test_pool_bounds_default_to_replicas_and_must_hold_them() -> None:
    pool = PoolConfig(replicas=2)
    assert (pool.lowest, pool.highest) == (2, 2)  # without the planner's bounds it stays put
    bounded = PoolConfig(replicas=2, min_replicas=1, max_replicas=4)
    assert (bounded.lowest, bounded.highest) == (1, 4)
    with pytest.raises(ValueError, match="min_replicas <= replicas <= max_replicas"):
        PoolConfig(replicas=5, max_replicas=3)


def test_the_planner_needs_a_profile_when_enabled() -> None:
    assert PlannerConfig().enabled is False
    with pytest.raises(ValueError, match=r"planner\.profile"):
        PlannerConfig(enabled=True)
    planner = PlannerConfig(enabled=True, profile="p.json")
    assert planner.prometheus == "http://127.0.0.1:9090"


def test_models_in_flight_stay_below_the_routers_serve_bound() -> None:
    # Past the router's max_ongoing_requests Serve would queue without bound: the 429 must come
    # first.
    config = ClusterConfig(models=[_model()])
    assert config.models[0].max_concurrent_requests < config.router.max_ongoing_requests
    two = [
        _model(name="a", max_concurrent_requests=60),
        _model(name="b", max_concurrent_requests=40),
    ]
    assert ClusterConfig(models=two, router={"max_ongoing_requests": 101}).api_keys == []
    with pytest.raises(pydantic.ValidationError, match=r"must exceed .* together \(100\)"):
        ClusterConfig(models=two, router={"max_ongoing_requests": 100})


def test_the_router_has_a_fixed_count_or_serves_autoscaling_bounds() -> None:
    assert not RouterConfig(replicas=3).autoscaled
    scaled = RouterConfig(replicas=2, max_replicas=8)
    assert scaled.autoscaled and (scaled.lowest, scaled.highest) == (2, 8)
    with pytest.raises(pydantic.ValidationError, match="greater than or equal to 1"):
        RouterConfig(replicas=0)  # no router, no API
    with pytest.raises(pydantic.ValidationError, match="min_replicas <= replicas"):
        RouterConfig(replicas=1, min_replicas=2, max_replicas=4)


def test_the_planner_leaves_no_room_for_serves_autoscaler_on_the_router() -> None:
    planner = {"enabled": True, "profile": "p.json"}
    fixed = ClusterConfig(models=[_model()], planner=planner, router={"replicas": 2})
    assert fixed.router.replicas == 2
    with pytest.raises(pydantic.ValidationError, match=r"external scaler.*not 2 to 4"):
        ClusterConfig(models=[_model()], planner=planner, router={"replicas": 2, "max_replicas": 4})


def test_relative_paths_are_made_absolute_where_the_config_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ray's processes work in another folder (cluster/ray_driver.py): they get absolute paths.
    monkeypatch.chdir(tmp_path)
    planner = {"enabled": True, "profile": "profile.json"}
    config = ClusterConfig(models=[_model(path="models/tiny")], planner=planner)
    assert config.models[0].path == str(tmp_path / "models" / "tiny")
    assert config.planner.profile == str(tmp_path / "profile.json")
