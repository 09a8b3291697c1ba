"""Every YAML in ``deploy/`` passes Ray's own validation: ``ray up`` files the autoscaler's config
check (defaults filled as ``ray up`` fills them), Serve configs ``ServeDeploySchema`` (the
RayService's embedded one too), and each application's ``args`` pdserve's ``ClusterConfig``."""

import re
from pathlib import Path

import pytest
import yaml
from ray.serve.schema import ServeDeploySchema

from pdserve.serving.config import ClusterConfig
from pdserve.serving.ray_compat import validate_ray_up_config

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
RAY_UP = ["cluster.yaml", "cluster-local.yaml"]
SERVE = ["serve.yaml", "serve-cluster.yaml"]


def _load(name: str) -> dict:
    return yaml.safe_load((DEPLOY / name).read_text())


def _check_serve(config: dict) -> None:
    ServeDeploySchema.model_validate(config)
    for app in config["applications"]:
        ClusterConfig.model_validate(app["args"])


@pytest.mark.parametrize("name", RAY_UP)
def test_ray_up_configs_validate(name: str) -> None:
    validate_ray_up_config(_load(name))


def test_the_aws_cluster_has_a_node_type_per_pool_resource() -> None:
    types = validate_ray_up_config(_load("cluster.yaml"))["available_node_types"]
    resources = {name: spec["resources"] for name, spec in types.items()}
    assert "prefill_node" in resources["prefill_worker"]
    assert "decode_node" in resources["decode_worker"]
    pools = _load("serve-cluster.yaml")["applications"][0]["args"]["models"][0]
    assert pools["prefill"]["resources"] == {"prefill_node": 1}
    assert pools["decode"]["resources"] == {"decode_node": 1}


def test_the_routers_and_the_planner_ask_for_what_only_the_head_offers() -> None:
    args = _load("serve-cluster.yaml")["applications"][0]["args"]
    assert set(args["router"]["resources"]) == {"router_node"}
    # The planner reads the Prometheus on the head's loopback, which the head's start commands
    # start (`pdserve prometheus`), beside the gateway.
    assert set(args["planner"]["resources"]) == {"router_node"}
    assert args["planner"]["prometheus_url"] == "http://127.0.0.1:9090"
    for name in RAY_UP:
        head = " ".join(_load(name)["head_start_ray_commands"])
        assert "pdserve prometheus" in head and "pdserve gateway" in head, name
    types = validate_ray_up_config(_load("cluster.yaml"))["available_node_types"]
    assert [name for name, spec in types.items() if "router_node" in spec["resources"]] == ["head"]
    local = _load("cluster-local.yaml")
    assert "router_node" in " ".join(local["head_start_ray_commands"])
    assert "router_node" not in " ".join(local["worker_start_ray_commands"])


@pytest.mark.parametrize("name", SERVE)
def test_serve_configs_validate(name: str) -> None:
    _check_serve(_load(name))


def test_the_rayservice_serve_config_validates() -> None:
    service = _load("kuberay/rayservice.yaml")
    assert service["kind"] == "RayService"
    assert service["spec"]["rayClusterConfig"]["enableInTreeAutoscaling"] is True
    _check_serve(yaml.safe_load(service["spec"]["serveConfigV2"]))


def test_the_podmonitor_scrapes_every_ray_pods_metrics_port() -> None:
    """deploy/kuberay/podmonitor.yaml selects the pods by the label KubeRay puts on every Ray pod,
    on a port every one of the RayService's pod templates names, the one Ray exports on."""
    monitor = _load("kuberay/podmonitor.yaml")
    assert monitor["kind"] == "PodMonitor"
    assert monitor["spec"]["selector"]["matchLabels"] == {"ray.io/is-ray-node": "yes"}
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    cluster = _load("kuberay/rayservice.yaml")["spec"]["rayClusterConfig"]
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    for group in groups:
        (container,) = group["template"]["spec"]["containers"]
        ports = {port["name"]: port["containerPort"] for port in container["ports"]}
        assert ports[endpoint["port"]] == int(group["rayStartParams"]["metrics-export-port"])


def test_the_image_installs_the_lock_with_the_makefiles_uv() -> None:
    dockerfile = (DEPLOY / "kuberay" / "Dockerfile").read_text()
    makefile = (DEPLOY.parent / "Makefile").read_text()
    (uv,) = re.findall(r"^UV_VERSION \?= (\S+)$", makefile, re.MULTILINE)
    assert f"uv=={uv}" in dockerfile
    assert "--require-hashes" in dockerfile and "-r requirements.lock" in dockerfile


def test_the_checks_refuse_a_misspelled_key() -> None:
    broken = _load("cluster.yaml")
    broken["idle_timeout_minuts"] = 5
    with pytest.raises(Exception, match="idle_timeout_minuts"):
        validate_ray_up_config(broken)
    broken = _load("serve.yaml")
    broken["applications"][0]["args"]["models"][0]["prefil"] = {"replicas": 1}
    with pytest.raises(ValueError, match="prefil"):
        _check_serve(broken)
