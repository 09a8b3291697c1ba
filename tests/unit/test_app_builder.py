"""What ``build_app`` binds, read back from Serve's application graph (no cluster): the router's
and each pool's deployment options, and the planner only when it is on."""

from pathlib import Path

import pytest
from ray.serve import Application

from pdserve.cluster.access import API_KEY_ENV
from pdserve.cluster.app import DRAIN_POLL_S, build_app
from pdserve.router.api.api_keys import key_digest


def _deployments(app: Application) -> dict[str, Application]:
    """The router's bound arguments: ``(models, prefill pools, decode pools, planner)``."""
    _, prefill, decode, planner = app._bound_deployment._replica_config.init_args
    pools = {**prefill, **{f"decode:{name}": pool for name, pool in decode.items()}}
    if planner is not None:
        pools["planner"] = planner
    return pools


def _config(tiny_model_dir: Path, **planner: object) -> dict:
    return {
        "models": [
            {
                "name": "tiny",
                "path": str(tiny_model_dir),
                "prefill": {"replicas": 1, "graceful_shutdown_timeout_s": 45, "max_replicas": 3},
                "decode": {"replicas": 2, "resources": {"decode_node": 1}},
            }
        ],
        "planner": planner,
    }


def test_pools_carry_their_serve_options(tiny_model_dir: Path) -> None:
    pools = _deployments(build_app(_config(tiny_model_dir)))
    assert set(pools) == {"tiny", "decode:tiny"}  # no planner unless enabled
    prefill = pools["tiny"]._bound_deployment
    assert prefill.name == "prefill-tiny" and prefill.num_replicas == 1
    assert prefill._deployment_config.graceful_shutdown_timeout_s == 45
    decode = pools["decode:tiny"]._bound_deployment
    assert decode.num_replicas == 2
    assert decode._deployment_config.graceful_shutdown_timeout_s == 60  # pdserve's default
    assert decode.ray_actor_options["resources"] == {"decode_node": 1}
    for pool in (prefill, decode):  # a stopping replica exits soon after its last stream
        assert pool._deployment_config.graceful_shutdown_wait_loop_s == DRAIN_POLL_S


def test_the_router_runs_its_count_or_serves_autoscaler(tiny_model_dir: Path) -> None:
    router = build_app(_config(tiny_model_dir))._bound_deployment
    assert router.name == "router" and router.num_replicas == 1
    assert router._deployment_config.autoscaling_config is None
    config = {**_config(tiny_model_dir), "router": {"replicas": 2, "max_replicas": 6}}
    scaled = build_app(config)._bound_deployment._deployment_config
    autoscaling = scaled.autoscaling_config
    assert (autoscaling.min_replicas, autoscaling.initial_replicas) == (2, 2)
    assert (autoscaling.max_replicas, autoscaling.target_ongoing_requests) == (6, 256)
    assert scaled.max_ongoing_requests == 4096  # the router holds streams: far above Serve's 5


def test_the_router_asks_for_the_resources_it_is_given(tiny_model_dir: Path) -> None:
    router = build_app(_config(tiny_model_dir))._bound_deployment
    assert router.ray_actor_options["resources"] == {}
    config = {**_config(tiny_model_dir), "router": {"resources": {"router_node": 0.01}}}
    pinned = build_app(config)._bound_deployment
    assert pinned.ray_actor_options["resources"] == {"router_node": 0.01}


def test_the_planner_is_bound_when_enabled(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = _config(tiny_model_dir, enabled=True, profile=str(tmp_path / "profile.json"))
    pools = _deployments(build_app(config))
    assert pools["planner"]._bound_deployment.name == "planner"


def test_the_router_gets_the_keys_digests_and_the_planner_no_keys(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(API_KEY_ENV, "sk-env,sk-file")
    config = {
        **_config(tiny_model_dir, enabled=True, profile=str(tmp_path / "profile.json")),
        "api_keys": ["sk-file"],
    }
    app = build_app(config)
    replica = app._bound_deployment._replica_config
    digests = [key_digest("sk-file"), key_digest("sk-env")]
    assert replica.init_kwargs == {"api_key_digests": digests}
    assert "sk-" not in repr((replica.init_args, replica.init_kwargs))
    planner = replica.init_args[3]._bound_deployment._replica_config.init_args[0]
    assert "api_keys" not in planner
