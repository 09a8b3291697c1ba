"""The Serve application: per model a prefill pool and a decode pool, and the router in front.

``build_app`` is the app builder for ``serve run``/``serve deploy``
(``import_path: pdserve.cluster.app:build_app``); its args are a ``ClusterConfig`` (or
``{"config": "path/to.yaml"}``). A model with ``prefill.replicas: 0`` is served aggregated: its
decode replicas prefill every prompt themselves. With ``planner.enabled``, a ``planner``
deployment sizes the pools (the app must then be deployed with ``external_scaler_enabled``).
The router runs ``router.replicas`` (or Serve autoscales it within its bounds); the API keys
(``cluster/access.py``) reach it as digests.
"""

from typing import Any

from ray import serve
from ray.serve import Application

from pdserve.cluster.access import api_keys
from pdserve.cluster.planner.deployment import Planner
from pdserve.decode_worker.worker import DecodeWorker
from pdserve.prefill_worker.worker import PrefillWorker
from pdserve.router.api.api_keys import key_digest
from pdserve.router.dispatch.kv_routing import KVAwareRouter
from pdserve.router.ingress import APIIngress
from pdserve.serving.config import (
    ROUTER_DEPLOYMENT,
    ClusterConfig,
    PoolConfig,
    RouterConfig,
    ServedModel,
    pool_deployment,
)
from pdserve.serving.logs import SERVE_LOGGING_CONFIG
from pdserve.serving.ray_compat import RequestRouterConfig

ROUTER_NUM_CPUS = 0.0
PLANNER_NUM_CPUS = 0.0
# How often a stopping replica looks whether its last request has ended (Serve's default: 2 s).
# Once idle it exits within this, so a scale-down, a redeploy or an app's deletion frees its
# replicas seconds sooner; the check is a counter read.
DRAIN_POLL_S = 0.25


def _pool(cls: type, role: str, pool: PoolConfig, served: ServedModel) -> Application:
    routing = served.routing
    options: dict[str, Any] = {}
    if routing.policy == "kv_aware":
        options["request_router_config"] = RequestRouterConfig(
            request_router_class=KVAwareRouter,
            request_router_kwargs={
                "role": role,
                "pool": served.name,
                "block_size": served.engine_config().block_size,
                "kv_overlap_weight": routing.kv_overlap_weight,
                "load_weight": routing.load_weight,
            },
            request_routing_stats_period_s=routing.stats_period_s,
        )
    deployment = serve.deployment(
        cls,
        name=pool_deployment(role, served.name),
        num_replicas=pool.replicas,
        max_ongoing_requests=pool.max_ongoing_requests,
        graceful_shutdown_timeout_s=pool.graceful_shutdown_timeout_s,
        graceful_shutdown_wait_loop_s=DRAIN_POLL_S,
        logging_config=SERVE_LOGGING_CONFIG,
        ray_actor_options={"num_cpus": pool.num_cpus, "resources": dict(pool.resources)},
        **options,
    )
    return deployment.bind(served.model_dump())


def _router_replicas(router: RouterConfig) -> dict[str, Any]:
    """A fixed count, or Serve's autoscaler between the bounds on requests in flight."""
    if not router.autoscaled:
        return {"num_replicas": router.replicas}
    autoscaling = {
        "min_replicas": router.lowest,
        "initial_replicas": router.replicas,
        "max_replicas": router.highest,
        "target_ongoing_requests": router.target_ongoing_requests,
    }
    return {"autoscaling_config": autoscaling}


def build_app(args: dict[str, Any]) -> Application:
    config = (
        ClusterConfig.from_yaml(args["config"])
        if set(args) == {"config"}
        else ClusterConfig.model_validate(args)
    )
    prefill, decode = {}, {}
    for served in config.models:
        if served.disaggregated:
            prefill[served.name] = _pool(PrefillWorker, "prefill", served.prefill, served)
        decode[served.name] = _pool(DecodeWorker, "decode", served.decode, served)
    planner = None
    if config.planner.enabled:
        planner = serve.deployment(
            Planner,
            name="planner",
            graceful_shutdown_wait_loop_s=DRAIN_POLL_S,
            logging_config=SERVE_LOGGING_CONFIG,
            ray_actor_options={
                "num_cpus": PLANNER_NUM_CPUS,
                "resources": dict(config.planner.resources),
            },
        ).bind(config.model_dump(exclude={"api_keys"}))
    router = serve.deployment(
        APIIngress,
        name=ROUTER_DEPLOYMENT,
        max_ongoing_requests=config.router.max_ongoing_requests,
        **_router_replicas(config.router),
        graceful_shutdown_wait_loop_s=DRAIN_POLL_S,
        logging_config=SERVE_LOGGING_CONFIG,
        ray_actor_options={
            "num_cpus": ROUTER_NUM_CPUS,
            "resources": dict(config.router.resources),
        },
    )
    # The router gets the keys' digests only: the keys stay in this process
    # (router/api/api_keys.py).
    digests = [key_digest(key) for key in api_keys(config)]
    models = [m.model_dump() for m in config.models]
    return router.bind(models, prefill, decode, planner, api_key_digests=digests)
