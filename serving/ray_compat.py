"""Ray's private and alpha APIs, reached from this module only: a Ray upgrade that moves one
fails here and in its test (``tests/unit/test_ray_compat.py``), not across the package.

Written against ``RAY_VERSION``, the ray pyproject pins. What it reaches: Serve's private names
(the controller's actor, its ``update_deployment_replicas`` and ``get_target_groups``, how
replica actors are named, the settings Serve read when imported), Serve's alpha APIs (the
request router, a handle's ``broadcast``), the autoscaler's config check for ``ray up`` files,
a metric's own record call (to export a counter at 0), and the temp folder of the node this
process is connected to.

Importing this module imports no part of Ray: ``cluster/serve_env.py`` reads Serve's settings
through it before anything may import ``ray.serve``. So each function imports what it uses, and
the request-router classes load on first use (the module's ``__getattr__``).
"""

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ray.serve.config import RequestRouterConfig
    from ray.serve.request_router import (
        FIFOMixin,
        PendingRequest,
        ReplicaID,
        RequestRouter,
        RunningReplica,
    )

__all__ = [
    "RAY_VERSION",
    "FIFOMixin",
    "PendingRequest",
    "ReplicaID",
    "RequestRouter",
    "RequestRouterConfig",
    "RunningReplica",
    "broadcast",
    "http_ingress_targets",
    "kill_replica_actor",
    "ray_temp_dir",
    "record_zero",
    "replica_actors",
    "serve_throughput_optimized",
    "set_target_replicas",
    "validate_ray_up_config",
]

RAY_VERSION = "2.60.0"  # the one this module was written and tested against

# Serve's request-router extension (alpha): where each name lives.
_LAZY = {
    "FIFOMixin": "ray.serve.request_router",
    "PendingRequest": "ray.serve.request_router",
    "ReplicaID": "ray.serve.request_router",
    "RequestRouter": "ray.serve.request_router",
    "RunningReplica": "ray.serve.request_router",
    "RequestRouterConfig": "ray.serve.config",
}
_SERVE_CONSTANTS = "ray.serve._private.constants"


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_LAZY[name]), name)


def serve_throughput_optimized() -> bool | None:
    """Whether Serve runs in throughput mode in this process, as it read its settings when
    imported; None when nothing has imported Serve yet (its settings can still be set)."""
    constants = sys.modules.get(_SERVE_CONSTANTS)
    return None if constants is None else constants.RAY_SERVE_THROUGHPUT_OPTIMIZED


def set_target_replicas(app_name: str, deployment: str, replicas: int, timeout_s: float) -> None:
    """Sets a deployment's replica target in place, as Serve's external-scaler endpoint does:
    the controller's ``update_deployment_replicas`` (the app needs ``external_scaler_enabled``)."""
    import ray
    from ray.serve._private.common import DeploymentID
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

    controller = ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
    deployment_id = DeploymentID(name=deployment, app_name=app_name)
    update = controller.update_deployment_replicas.remote(deployment_id, replicas)
    ray.get(update, timeout=timeout_s)


def http_ingress_targets(app_name: str, timeout_s: float) -> list[tuple[str, int]]:
    """Where Serve serves the app's HTTP now, as (ip, port): with direct ingress, each ingress
    replica's own port (while none runs, Serve's proxy), from the controller's target groups."""
    import ray
    from ray.serve._private.common import RequestProtocol
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

    controller = ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
    groups = ray.get(controller.get_target_groups.remote(app_name), timeout=timeout_s)
    return [
        (target.ip, target.port)
        for group in groups
        if group.protocol == RequestProtocol.HTTP
        for target in group.targets
    ]


def replica_actors(app_name: str, deployment: str) -> dict[str, str]:
    """The deployment's replica actors alive in the GCS: replica id (the one
    ``serve.get_replica_context()`` gives) -> actor name. Serve names each actor after its
    replica's full id; named actors need no dashboard, unlike Ray's state API."""
    import ray
    from ray.serve._private.common import DeploymentID, ReplicaID
    from ray.serve._private.constants import SERVE_NAMESPACE

    wanted = DeploymentID(name=deployment, app_name=app_name)
    replicas = {}
    for actor in ray.util.list_named_actors(all_namespaces=True):
        name = actor["name"]
        if actor["namespace"] != SERVE_NAMESPACE or not ReplicaID.is_full_id_str(name):
            continue
        replica = ReplicaID.from_full_id_str(name)
        if replica.deployment_id == wanted:
            replicas[replica.unique_id] = name
    return replicas


def kill_replica_actor(actor_name: str) -> None:
    """Kills a replica's actor (a name from ``replica_actors``); Serve starts a replacement."""
    import ray
    from ray.serve._private.constants import SERVE_NAMESPACE

    ray.kill(ray.get_actor(actor_name, namespace=SERVE_NAMESPACE))


def broadcast(handle: Any, method: str, timeout_s: float) -> list[Any]:
    """``method`` called on every replica the handle knows of, at once (a call routed by load
    would never reach a busy replica while an idle one answers): each one's answer, or the
    exception it raised. Raises ``TimeoutError`` past ``timeout_s``."""
    return handle.broadcast(method).results(timeout_s=timeout_s, return_exceptions=True)


def validate_ray_up_config(config: dict) -> dict:
    """A ``ray up`` cluster config with the defaults ``ray up`` fills in, checked against the
    autoscaler's schema (raises on a bad one). ``config`` is left as it was."""
    import copy

    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    return prepared


def record_zero(counter: Any, tags: dict[str, str]) -> None:
    """Records 0 in a ``ray.util.metrics.Counter`` for ``tags``, which ``inc`` refuses: Ray's
    metrics agent then exports that series at 0 until it is first counted."""
    counter._record(0, tags)


def ray_temp_dir() -> str:
    """The temp folder of the Ray node this process is connected to (``/tmp/ray`` unless
    ``RAY_TMPDIR`` or ``--temp-dir`` moved it): where Ray's dashboard writes the file that lists
    the nodes' metrics agents for Prometheus."""
    import ray._private.worker

    return ray._private.worker._global_node.get_temp_dir_path()
