"""Every private or alpha name of Ray that ``serving/ray_compat.py`` uses, touched here: a Ray
upgrade that moves one fails in this file, naming it, before a cluster does."""

import importlib
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
import ray

from pdserve.serving import ray_compat

ROOT = Path(__file__).resolve().parents[2]

# module -> the names ray_compat and its callers reach in it ("Class.member" reaches into a class)
USED = {
    "ray.serve._private.constants": [
        "SERVE_CONTROLLER_NAME",
        "SERVE_NAMESPACE",
        "RAY_SERVE_THROUGHPUT_OPTIMIZED",
    ],
    "ray.serve._private.common": [
        "DeploymentID.name",
        "DeploymentID.app_name",
        "ReplicaID.is_full_id_str",
        "ReplicaID.from_full_id_str",
        "ReplicaID.to_full_id_str",
        "ReplicaID.unique_id",
        "ReplicaID.deployment_id",
        "RequestProtocol.HTTP",
    ],
    "ray.serve._private.controller": [
        "ServeController.update_deployment_replicas",
        "ServeController.get_target_groups",
    ],
    "ray.serve.schema": ["TargetGroup.protocol", "TargetGroup.targets", "Target.ip", "Target.port"],
    "ray.serve.request_router": [
        "FIFOMixin",
        "RequestRouter.initialize_state",
        "RequestRouter.update_replicas",
        "RequestRouter.choose_replicas",
        "RequestRouter.on_request_routed",
        "RunningReplica.replica_id",
        "RunningReplica.routing_stats",
        "PendingRequest.args",
        "ReplicaID",
    ],
    "ray.serve.config": [
        "RequestRouterConfig.request_router_class",
        "RequestRouterConfig.request_router_kwargs",
        "RequestRouterConfig.request_routing_stats_period_s",
    ],
    "ray.serve.handle": ["DeploymentHandle.broadcast", "DeploymentBroadcastResponse.results"],
    "ray.autoscaler._private.util": ["prepare_config", "validate_config"],
    "ray.util.metrics": ["Metric._record"],
    "ray._private.worker": ["_global_node"],
    "ray._private.node": ["Node.get_temp_dir_path"],
}


def _has(owner: object, name: str) -> bool:
    """An attribute, or a field of a dataclass or pydantic model (which has no class attribute
    when it has no default)."""
    fields = getattr(owner, "__dataclass_fields__", {}) or getattr(owner, "model_fields", {})
    return hasattr(owner, name) or name in fields


def _missing(module_name: str, dotted: str) -> str:
    return (
        f"{module_name}.{dotted} is missing from ray {ray.__version__}; serving/ray_compat.py "
        f"uses it and was written against ray {ray_compat.RAY_VERSION}"
    )


@pytest.mark.parametrize(
    ("module_name", "dotted"), [(m, name) for m, names in USED.items() for name in names]
)
def test_each_name_the_seam_uses_is_there(module_name: str, dotted: str) -> None:
    try:
        owner = importlib.import_module(module_name)
    except ImportError as error:
        pytest.fail(f"{_missing(module_name, dotted)} ({error})")
    for part in dotted.split("."):
        if not _has(owner, part):
            pytest.fail(_missing(module_name, dotted))
        owner = getattr(owner, part, None)


def test_the_seam_exports_the_request_router_api() -> None:
    from ray.serve import request_router

    assert ray_compat.RequestRouter is request_router.RequestRouter
    assert issubclass(ray_compat.FIFOMixin, object)
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        ray_compat.Nothing  # noqa: B018


def test_a_replica_actor_name_parses_back_to_its_deployment() -> None:
    """``replica_actors`` finds a deployment's replicas by parsing Serve's actor names."""
    from ray.serve._private.common import DeploymentID, ReplicaID

    deployment = DeploymentID(name="decode-tiny", app_name="pdserve")
    name = ReplicaID(unique_id="abc123", deployment_id=deployment).to_full_id_str()
    assert ReplicaID.is_full_id_str(name)
    parsed = ReplicaID.from_full_id_str(name)
    assert (parsed.deployment_id, parsed.unique_id) == (deployment, "abc123")


def test_the_pinned_ray_is_the_one_the_seam_was_written_against() -> None:
    """A bump of the pin fails here: check each name above, then move ``RAY_VERSION``."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = [d for d in project["dependencies"] if d.replace(" ", "").startswith(("ray[", "ray="))]
    assert pins == [f"ray[serve]=={ray_compat.RAY_VERSION}"]
    assert ray.__version__ == ray_compat.RAY_VERSION, (
        f"ray {ray.__version__} is installed; serving/ray_compat.py was written against "
        f"ray {ray_compat.RAY_VERSION}"
    )


@pytest.mark.slow  # a fresh interpreter: seconds of imports
def test_serve_reads_its_settings_after_the_cli_applies_them() -> None:
    """The seam imports no Ray, so ``serve_env`` can use it before Serve is imported; Serve then
    starts in throughput mode."""
    code = """
        import os, sys
        os.environ.pop("RAY_SERVE_THROUGHPUT_OPTIMIZED", None)
        from pdserve.cluster.serve_env import apply_serve_env
        from pdserve.serving.ray_compat import serve_throughput_optimized
        before = serve_throughput_optimized(), "ray" in sys.modules
        apply_serve_env()
        import ray.serve
        print(before, serve_throughput_optimized())
    """
    run = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[-2] == "(None, False) True"
