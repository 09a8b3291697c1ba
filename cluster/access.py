"""Who may call the served API: the keys from the config, ``pdserve serve --api-key`` and the
``PDSERVE_API_KEY`` environment variable, and a warning when the API is open to the network.

``PDSERVE_API_KEY`` (as vLLM's ``VLLM_API_KEY``) holds one key, or several separated by commas
(a key never holds a comma: keys are tokens such as ``openssl rand -hex 32`` prints). It is read
where the app is built (``build_app``): by ``pdserve serve`` and ``serve run`` on this machine,
and, for ``serve deploy``, on the cluster, so the key need not be written into any file.
"""

import ipaddress
import os
import sys
from collections.abc import Mapping

from pdserve.serving.config import ClusterConfig

API_KEY_ENV = "PDSERVE_API_KEY"
KEY_SEPARATOR = ","
LOCALHOST = "localhost"


def env_api_keys(environ: Mapping[str, str] = os.environ) -> list[str]:
    """The keys in ``PDSERVE_API_KEY`` (none if unset or empty)."""
    keys = environ.get(API_KEY_ENV, "").split(KEY_SEPARATOR)
    return [key.strip() for key in keys if key.strip()]


def api_keys(config: ClusterConfig, environ: Mapping[str, str] = os.environ) -> list[str]:
    """Every key the router accepts: the config's, then the environment's, each once."""
    keys = [key.get_secret_value() for key in config.api_keys] + env_api_keys(environ)
    return list(dict.fromkeys(keys))


def is_loopback(host: str) -> bool:
    if host == LOCALHOST:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def warn_if_open(config: ClusterConfig, environ: Mapping[str, str] = os.environ) -> bool:
    """Warns on stderr when the API takes calls from other machines without a key; returns
    whether it warned. Serve's gRPC proxy always listens on every interface."""
    if api_keys(config, environ):
        return False
    exposed = [f"gRPC on port {config.grpc_port} of every interface"]
    if not is_loopback(config.http_host):
        exposed.insert(0, f"HTTP on {config.http_host}:{config.http_port}")
    print(
        f"pdserve: warning: no API key is set, so anyone who can reach {' and '.join(exposed)} "
        f"may use the models. Set {API_KEY_ENV} or pass --api-key.",
        file=sys.stderr,
        flush=True,
    )
    return True
