"""Ray Serve's throughput mode for every process of a pdserve cluster, the driver included.

``RAY_SERVE_THROUGHPUT_OPTIMIZED`` (Ray >= 2.56): direct ingress (the router replica serves HTTP
and gRPC on ports of its own, 30000+ and 40000+, which Serve's proxy forwards to), gRPC between
deployments, user code on each replica's main loop, request-path logs buffered: through the
cluster, ITL came much closer to the offline engine's (docs/benchmarks.md). One part stays off:
handle routers keep their own loop, since drivers and tests call handles synchronously.

Serve reads these when it is imported, in each process, and a handle carries the settings of the
process that made it: the app's handles are made in the driver that deploys it, so the driver
must have them before anything imports ``ray.serve``. The CLI applies them first thing; a Ray
cluster we start inherits them; on a running one, set them where its nodes start
(deploy/README.md).
"""

import logging
import os

from pdserve.serving.ray_compat import serve_throughput_optimized

logger = logging.getLogger(__name__)

SERVE_ENV = {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1", "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "1"}


def apply_serve_env() -> dict[str, str]:
    """Sets the defaults in this process (a value already set wins); returns the values to hand
    to Ray processes. Warns if Serve was imported before, with other settings."""
    for name, value in SERVE_ENV.items():
        os.environ.setdefault(name, value)
    in_effect = serve_throughput_optimized()
    wanted = os.environ["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "1"
    if in_effect is not None and in_effect != wanted:
        logger.warning(
            "ray.serve was imported before its settings were applied: the handles made in "
            "this process use Serve's defaults (see pdserve.cluster.serve_env)"
        )
    return {name: os.environ[name] for name in SERVE_ENV}
