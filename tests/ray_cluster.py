"""The test session's one Ray cluster, for every test that runs on Ray (the ``ray_cluster``
fixture in tests/conftest.py starts it on first use and stops it at the end of the session).

A head node and two worker nodes of a ``ray.cluster_utils.Cluster``, all on this host: one worker
offers the custom resource ``prefill_node``, the other ``decode_node``, for the tests that place
pools on nodes of their own; other tests' replicas land anywhere. The head runs Ray's dashboard on
loopback (Prometheus reads the service-discovery file it writes) and every process reports its
metrics every ``METRICS_REPORT_INTERVAL_MS``, as a cluster ``pdserve serve`` starts does. Serve's
proxies run on the head, on free ports; each test module deploys its app with ``serving`` and
deletes it at its end, so every module starts from fresh replicas.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
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
# Serve keeps a direct-ingress replica (our router) alive 30 s after it is told to stop, for an
# external load balancer to take it out of rotation; the tests have none, and each module deletes
# its app.
SERVE_TEST_ENV = {"RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "0"}


@dataclass(frozen=True)
class SessionCluster:
    address: str  # the head's GCS
    http_port: int
    grpc_port: int
    node_ids: dict[str, str]  # pool ("prefill", "decode") -> the id of the node offering it

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


@contextmanager
def session_cluster() -> Iterator[SessionCluster]:
    import ray
    from ray.cluster_utils import Cluster

    nodes = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": NODE_CPUS,
            "object_store_memory": OBJECT_STORE_BYTES,
            "include_dashboard": True,
            "dashboard_host": "127.0.0.1",
            "dashboard_port": free_port(),
            "_system_config": {"metrics_report_interval_ms": METRICS_REPORT_INTERVAL_MS},
        },
    )
    try:
        node_ids = {
            pool: nodes.add_node(
                num_cpus=NODE_CPUS,
                object_store_memory=OBJECT_STORE_BYTES,
                resources={resource: 1},
            ).node_id
            for pool, resource in POOL_RESOURCES.items()
        }
        nodes.wait_for_nodes()
        connect(nodes.address, env_vars=SERVE_TEST_ENV)
        cluster = SessionCluster(nodes.address, free_port(), free_port(), node_ids)
        start_proxies("127.0.0.1", cluster.http_port, cluster.grpc_port, location="HeadOnly")
        yield cluster
    finally:
        ray.shutdown()
        nodes.shutdown()
