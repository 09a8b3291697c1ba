"""The test session's one Ray cluster, for every test that runs on Ray (the ``ray_cluster``
fixture in tests/conftest.py starts it on first use and stops it at the end of the session).

A ``ray.cluster_utils.Cluster`` head whose autoscaler runs Ray's fake multi-node provider
(``RAY_FAKE_CLUSTER=1``): a replica that asks for ``prefill_node`` or ``decode_node`` makes it
add a node of that type on this host, as ``ray up`` with deploy/cluster.yaml adds a machine, and a
node idle for ``IDLE_S`` goes again. Other tests' replicas ask for no such resource and run on the
head. The head runs Ray's dashboard on loopback (Prometheus reads the service-discovery file it
writes) and every process reports its metrics every ``METRICS_REPORT_INTERVAL_MS``, as a cluster
``pdserve serve`` starts does. Serve's proxies run on the head, on free ports; each test module
deploys its app with ``serving`` and deletes it at its end, so every module starts from fresh
replicas, except those that share one app (``shared_app`` in tests/conftest.py).
"""

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdserve.cluster.serve import (
    APP_NAME,
    METRICS_REPORT_INTERVAL_MS,
    connect,
    deploy,
    free_port,
    start_proxies,
)
from pdserve.serving.config import ClusterConfig

NODE_CPUS = 1  # logical: Serve's actors and the pools ask for none
OBJECT_STORE_BYTES = 512 * 2**20  # per node; Ray's default (30% of memory each) would not fit
POOL_RESOURCES = {"prefill": "prefill_node", "decode": "decode_node"}
IDLE_S = 6.0  # how long an added node may idle before the autoscaler removes it
# The fake provider runs only with the first; the autoscaler looks every second.
AUTOSCALER_ENV = {"RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1"}
# Serve keeps a direct-ingress replica (our router) alive 30 s after it is told to stop, for an
# external load balancer to take it out of rotation; the tests have none, and each module deletes
# its app. Serve's controller looks over its deployments every 0.1 s by default, the largest
# share of an idle cluster's CPU (a third of a core in all): every 0.5 s it takes 0.1 core less
# from the tests beside it (docs/benchmarks.md, "The test suite on two cores").
SERVE_TEST_ENV = {
    "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "0",
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.5",
}


@dataclass(frozen=True)
class SessionCluster:
    address: str  # the head's GCS
    http_port: int
    grpc_port: int
    log_dir: Path  # the session's logs (every worker's stderr in worker-*.err)

    def config(self, models: list[dict[str, Any]], **fields: Any) -> ClusterConfig:
        """A cluster config for ``models`` on this cluster's Serve ports."""
        return ClusterConfig(
            models=models, http_port=self.http_port, grpc_port=self.grpc_port, **fields
        )

    @contextmanager
    def serving(self, config: ClusterConfig) -> Iterator[ClusterConfig]:
        """``config``'s app deployed for the block, then deleted (its replicas gone)."""
        from ray import serve

        deploy(config)
        try:
            yield config
        finally:
            serve.delete(APP_NAME)

    @staticmethod
    def nodes_offering(resource: str) -> list[str]:
        """The ids of the live nodes that offer ``resource``."""
        import ray

        return [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get(resource)]


def fake_autoscaling_config(gcs_address: str) -> dict[str, Any]:
    """A ``ray up`` config for the fake provider: the head, and one node type per pool resource
    (at most one node each)."""
    worker = {"CPU": NODE_CPUS, "object_store_memory": OBJECT_STORE_BYTES}
    types = {
        f"{pool}-node": {
            "resources": {**worker, resource: 1},
            "node_config": {},
            "min_workers": 0,
            "max_workers": 1,
        }
        for pool, resource in POOL_RESOURCES.items()
    }
    head = {"resources": {"CPU": NODE_CPUS}, "node_config": {}, "max_workers": 0}
    return {
        "cluster_name": "pdserve-tests",
        "max_workers": len(types),
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": IDLE_S / 60,
        "provider": {
            "type": "fake_multinode",
            "use_node_id_as_ip": True,
            "disable_node_updaters": True,
            "disable_launch_config_check": True,
            "gcs_address": gcs_address,
        },
        "auth": {"ssh_user": "ubuntu"},
        "head_node_type": "ray.head.default",
        "available_node_types": {"ray.head.default": head, **types},
        **{key: [] for key in ("cluster_synced_files", "initialization_commands")},
        **{key: [] for key in ("setup_commands", "head_setup_commands", "worker_setup_commands")},
        **{key: [] for key in ("head_start_ray_commands", "worker_start_ray_commands")},
        "file_mounts": {},
        "file_mounts_sync_continuously": False,
    }


@contextmanager
def session_cluster(workdir: Path) -> Iterator[SessionCluster]:
    import ray
    from ray.cluster_utils import Cluster

    saved = {name: os.environ.get(name) for name in AUTOSCALER_ENV}
    os.environ.update(AUTOSCALER_ENV)  # the head's autoscaler process inherits them
    gcs_port = free_port()
    address = f"{ray.util.get_node_ip_address()}:{gcs_port}"
    autoscaling = workdir / "fake-cluster.json"
    autoscaling.write_text(json.dumps(fake_autoscaling_config(address)))
    nodes = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": NODE_CPUS,
            "object_store_memory": OBJECT_STORE_BYTES,
            "gcs_server_port": gcs_port,
            "autoscaling_config": str(autoscaling),
            "include_dashboard": True,
            "dashboard_host": "127.0.0.1",
            "dashboard_port": free_port(),
            "_system_config": {"metrics_report_interval_ms": METRICS_REPORT_INTERVAL_MS},
        },
    )
    try:
        connect(nodes.address, env_vars=SERVE_TEST_ENV)
        log_dir = Path(nodes.head_node.get_logs_dir_path())
        cluster = SessionCluster(nodes.address, free_port(), free_port(), log_dir)
        start_proxies("127.0.0.1", cluster.http_port, cluster.grpc_port, location="HeadOnly")
        yield cluster
    finally:
        ray.shutdown()
        nodes.shutdown()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
