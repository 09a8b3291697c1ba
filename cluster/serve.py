"""Serve models on Ray: router + prefill + decode pools, until Ctrl-C (``pdserve serve``).

With no model: serves the default one (``served_model.py``: SmolLM2-135M-Instruct where its wheel
is installed, else the built-in tiny model), starting a local Ray cluster and deploying one prefill
and one decode replica behind the router. ``pdserve serve MODEL`` (or ``--model``) serves an HF
folder or a GGUF file with the pool and engine flags, vLLM's names where vLLM has the knob;
``--config`` takes a deployment YAML (``ClusterConfig``) instead.
"""

import argparse
import functools
import random
import signal
import socket
import threading
from pathlib import Path

from pdserve.cluster.access import API_KEY_ENV, warn_if_open
from pdserve.cluster.engine_flags import add_engine_arguments, engine_section
from pdserve.cluster.gateway import Gateway, ingress_servers, replica_bound
from pdserve.cluster.ports import LOOPBACK, check_free
from pdserve.cluster.prometheus import PrometheusServer, local_url, prometheus_binary
from pdserve.cluster.ray_driver import init_ray
from pdserve.cluster.serve_env import apply_serve_env
from pdserve.cluster.served_model import default_model, served_model_name
from pdserve.engine.config import ModelConfig
from pdserve.engine.generation_config import load_generation_defaults
from pdserve.engine.tokenizer import Tokenizer
from pdserve.serving.config import (
    DEFAULT_GRPC_PORT,
    DEFAULT_HTTP_PORT,
    DEFAULT_LOCAL_PREFILL_MAX_TOKENS,
    DEFAULT_LOG_STATS_INTERVAL_S,
    DEFAULT_MAX_CONCURRENT_REQUESTS,
    DEFAULT_PROMETHEUS_PORT,
    ClusterConfig,
)
from pdserve.serving.ray_compat import ray_temp_dir

APP_NAME = "pdserve"
GRPC_SERVICER = "pdserve.router.api.grpc_service.add_GenerationServicer_to_server"
# How often each process of a new local cluster sends its metrics to its node's agent (Ray's
# default, 10 s, would leave Prometheus and the planner that far behind).
METRICS_REPORT_INTERVAL_MS = 2000
_joined = False  # whether `start` joined a running cluster (else it started a local one)
PROFILE_FILE = "pdserve-profile.json"  # in an HF folder; beside a GGUF file, named after it
DEFAULT_MAX_REPLICAS = 4
# Ports for free_port: above Ray's worker ports (10002-19999 by default), below Serve's
# direct-ingress ports (30000+) and Linux's ephemeral ports (32768+).
FREE_PORT_RANGE = (20000, 30000)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "model_tag",
        nargs="?",
        metavar="MODEL",
        help="an HF checkpoint folder or a GGUF file (default: SmolLM2-135M-Instruct)",
    )
    source.add_argument("--config", help="deployment YAML (see README: configuration)")
    source.add_argument("--model", help="MODEL, as a flag")
    parser.add_argument(
        "--served-model-name",
        "--name",
        dest="name",
        help="the name clients send as `model` (default: the folder's name, or the GGUF file's "
        "without its quantization tag)",
    )
    parser.add_argument("--prefill-replicas", type=int, default=1, help="0: aggregated")
    parser.add_argument("--decode-replicas", type=int, default=1)
    parser.add_argument(
        "--local-prefill-max-tokens", type=int, default=DEFAULT_LOCAL_PREFILL_MAX_TOKENS
    )
    parser.add_argument("--kv-backend", choices=["auto", "nixl", "object_store"], default="auto")
    parser.add_argument(
        "--max-concurrent-requests",
        type=int,
        default=DEFAULT_MAX_CONCURRENT_REQUESTS,
        help="the model's requests in flight in a router replica; one more gets 429 at once",
    )
    parser.add_argument(
        "--router-replicas",
        type=int,
        default=1,
        help="router replicas, each bounding the model's requests by --max-concurrent-requests",
    )
    parser.add_argument(
        "--api-key",
        action="append",
        default=[],
        metavar="KEY",
        help=f"a key clients must send as `Authorization: Bearer KEY` (repeat for several; "
        f"also read from {API_KEY_ENV}, which `ps` does not show)",
    )
    parser.add_argument(
        "--host", default=ClusterConfig.model_fields["http_host"].default, help="where HTTP listens"
    )
    parser.add_argument(
        "--port", "--http-port", dest="port", type=int, default=DEFAULT_HTTP_PORT, help="HTTP"
    )
    parser.add_argument("--grpc-port", type=int, default=DEFAULT_GRPC_PORT)
    parser.add_argument("--address", help="join a running Ray cluster (e.g. auto); default: local")
    parser.add_argument(
        "--gateway",
        action=argparse.BooleanOptionalAction,
        help="serve HTTP through HAProxy in front of the router replicas: past their bound it "
        "answers 429 itself, so a burst never reaches them (default: on for a local cluster, "
        "off with --address)",
    )
    parser.add_argument(
        "--gateway-access-log",
        type=Path,
        metavar="FILE",
        help="append a line per HTTP request to FILE: status, replica and HAProxy's timers "
        "(cluster/gateway.py: ACCESS_LOG_FORMAT)",
    )
    parser.add_argument(
        "--prometheus",
        action="store_true",
        help="also start a Prometheus server on loopback that scrapes the cluster's metrics",
    )
    parser.add_argument("--prometheus-port", type=int, default=DEFAULT_PROMETHEUS_PORT)
    parser.add_argument(
        "--disable-log-stats", action="store_true", help="no periodic stats line per replica"
    )
    parser.add_argument(
        "--planner",
        action="store_true",
        help="let the SLA planner size the pools to the model's targets (starts Prometheus)",
    )
    parser.add_argument(
        "--profile",
        help=f"the model's `pdserve profile` JSON (default: {PROFILE_FILE} in the model's "
        "directory, made there first if missing)",
    )
    parser.add_argument(
        "--max-replicas", type=int, default=DEFAULT_MAX_REPLICAS, help="per pool, for the planner"
    )
    add_engine_arguments(parser)


def cluster_config(args: argparse.Namespace) -> ClusterConfig:
    """The config from ``--config`` or the flags, with the ``--api-key``s added to its keys; a
    planner (``--planner``, or enabled in the file) without a Prometheus of its own reads the
    one ``run`` starts."""
    config = _from_file_or_flags(args)
    raw = config.model_dump()
    raw["api_keys"] = [*config.api_keys, *args.api_key]
    if not (args.planner or config.planner.enabled):
        return ClusterConfig.model_validate(raw)
    planner = raw["planner"]
    planner["enabled"] = True
    planner["prometheus_url"] = planner["prometheus_url"] or local_url(args.prometheus_port)
    planner["profile"] = args.profile or planner["profile"] or _profile(config.models[0].path)
    return ClusterConfig.model_validate(raw)


def profile_path(model: str | Path) -> Path:
    """Where the planner's profile of ``model`` is kept: in an HF folder, or beside a GGUF file
    under the file's name (a folder may hold several)."""
    model = Path(model)
    if model.is_dir():
        return model / PROFILE_FILE
    return model.with_name(f"{model.stem}.{PROFILE_FILE}")


def _profile(model: str) -> str:
    """The model's profile for the planner, made (once) where none is given."""
    path = profile_path(model)
    if not path.is_file():
        from pdserve.cluster.planner.profiler import profile_and_save

        print(f"pdserve: profiling {model} for the planner (once, into {path})", flush=True)
        profile_and_save(Path(model), path)
    return str(path)


def _from_file_or_flags(args: argparse.Namespace) -> ClusterConfig:
    if args.config:
        return ClusterConfig.from_yaml(args.config)
    given = args.model_tag or args.model
    path = Path(given) if given else default_model()
    highest = max(args.max_replicas, args.prefill_replicas, args.decode_replicas)
    bounds = {"min_replicas": 1, "max_replicas": highest} if args.planner else {}
    prefill_bounds = bounds if args.prefill_replicas > 0 else {}
    model = {
        "name": args.name or served_model_name(path),
        "log_stats_interval_s": 0.0 if args.disable_log_stats else DEFAULT_LOG_STATS_INTERVAL_S,
        "path": str(path.resolve()),
        "engine": engine_section(args),
        "prefill": {"replicas": args.prefill_replicas, **prefill_bounds},
        "decode": {"replicas": args.decode_replicas, **bounds},
        "routing": {"local_prefill_max_tokens": args.local_prefill_max_tokens},
        "kv_transfer": {"backend": args.kv_backend},
        "max_concurrent_requests": args.max_concurrent_requests,
    }
    return ClusterConfig(
        models=[model],
        http_host=args.host,
        http_port=args.port,
        grpc_port=args.grpc_port,
        router={"replicas": args.router_replicas},
    )


def start(
    config: ClusterConfig,
    address: str | None = None,
    dashboard: bool = False,
    behind_gateway: bool = False,
) -> None:
    """Starts (or joins) Ray, then Serve's HTTP and gRPC proxies, and deploys the app.
    ``behind_gateway``: Serve's HTTP proxy on a free loopback port, the config's HTTP port left to
    the gateway (``cluster/gateway.py``)."""
    connect(address, dashboard)
    if behind_gateway:
        start_proxies(LOOPBACK, free_port(), config.grpc_port)
    else:
        start_proxies(config.http_host, config.http_port, config.grpc_port)
    deploy(config)


def free_port() -> int:
    """A TCP port free on every interface now, from ``FREE_PORT_RANGE``.

    The kernel's own choice (bind to port 0) comes from the ephemeral range, where the many
    outgoing connections of a Ray cluster also take their local ports: one of them may hold the
    port by the time Serve binds it.
    """
    for port in random.sample(range(*FREE_PORT_RANGE), 100):
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {FREE_PORT_RANGE}")


def joins(address: str | None) -> bool:
    """Whether ``address`` names a running cluster to join ("local", or none: a new one)."""
    return address is not None and address != "local"


def connect(
    address: str | None = None, dashboard: bool = False, env_vars: dict[str, str] | None = None
) -> None:
    """Connects this process to Ray: a new local cluster by default, else the one at ``address``.

    A new local cluster exports metrics every ``METRICS_REPORT_INTERVAL_MS``; ``dashboard`` starts
    Ray's dashboard on loopback, which writes the service-discovery file Prometheus reads. Ray's
    own ports (GCS, raylet, object manager, workers) cannot be held to loopback: Ray binds them
    on every interface and turns a loopback node address into the machine's; a new local cluster
    guards them with Ray's token auth, on by default in Ray 2.60 (``RAY_AUTH_MODE``). The
    processes of this job (Serve's among them, if it starts them) get Serve's settings and
    ``env_vars``.
    """
    env_vars = apply_serve_env() | (env_vars or {})
    # "local": a new cluster, never one a stray `ray start` left behind.
    global _joined
    _joined = joins(address)
    local = {"_system_config": {"metrics_report_interval_ms": METRICS_REPORT_INTERVAL_MS}}
    init_ray(
        address=address or "local",
        include_dashboard=dashboard,
        dashboard_host=LOOPBACK,  # its API can run code on the cluster
        runtime_env={"env_vars": env_vars},
        **({} if _joined else local),
    )


def start_proxies(
    http_host: str, http_port: int, grpc_port: int, location: str = "EveryNode"
) -> None:
    """Starts Serve with its HTTP and gRPC proxies (on a cluster where Serve runs already, Serve
    keeps the ports it has and warns if these differ)."""
    from ray import serve
    from ray.serve.config import gRPCOptions

    serve.start(
        proxy_location=location,
        http_options={"host": http_host, "port": http_port},
        grpc_options=gRPCOptions(port=grpc_port, grpc_servicer_functions=[GRPC_SERVICER]),
    )


def deploy(config: ClusterConfig) -> None:
    """Deploys (or updates in place) the app for ``config`` on the running Serve."""
    from ray import serve

    from pdserve.cluster.app import build_app

    serve.run(
        build_app(config.model_dump()),
        name=APP_NAME,
        route_prefix="/",
        external_scaler_enabled=config.planner.enabled,
    )


def stop() -> None:
    """Ends what ``start`` began: a local cluster goes down whole (Serve's own shutdown waits 30 s
    on its controller for nothing); on a joined cluster only our app is deleted, since other apps
    may share its Serve."""
    import ray
    from ray import serve

    if _joined:
        serve.delete(APP_NAME)
    ray.shutdown()


def check_models(config: ClusterConfig) -> None:
    """Reads each model's config, tokenizer and generation defaults as the router will, so that
    a checkpoint pdserve cannot load fails here in one line (``CheckpointError``), not in a
    replica after Ray starts; the defaults a model sets are logged here too."""
    for model in config.models:
        ModelConfig.from_pretrained(model.path)
        Tokenizer.from_pretrained(model.path)
        load_generation_defaults(model.engine_config())


def wants_gateway(args: argparse.Namespace) -> bool:
    """Whether ``pdserve serve`` runs the gateway: for a local cluster unless ``--no-gateway``;
    never for one it joins, whose Serve proxy serves HTTP as that cluster was deployed."""
    if args.gateway and joins(args.address):
        raise SystemExit("pdserve serve: --gateway serves a local cluster, not one at --address")
    wanted = not joins(args.address) if args.gateway is None else args.gateway
    if args.gateway_access_log is not None and not wanted:
        raise SystemExit("pdserve serve: --gateway-access-log is the gateway's: no gateway runs")
    return wanted


def run(args: argparse.Namespace) -> int:
    with_gateway = wants_gateway(args)
    config = cluster_config(args)
    check_models(config)
    if not joins(args.address):  # a running cluster's Serve may hold these ports itself
        check_free(config.http_host, config.http_port, config.grpc_port)
    stopping = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    with_prometheus = args.prometheus or config.planner.prometheus_url == local_url(
        args.prometheus_port
    )
    if with_prometheus:
        prometheus_binary()  # before the cluster starts: a missing package fails at once
    warn_if_open(config)
    start(config, args.address, dashboard=with_prometheus, behind_gateway=with_gateway)
    prometheus = gateway = None
    try:
        if with_gateway:
            per_replica = replica_bound(config)
            servers = functools.partial(ingress_servers, APP_NAME)
            gateway = Gateway(
                servers,
                per_replica,
                config.http_host,
                config.http_port,
                access_log=args.gateway_access_log,
            )
        if with_prometheus:
            prometheus = PrometheusServer(args.prometheus_port, ray_temp_dir=ray_temp_dir())
        names = ", ".join(m.name for m in config.models)
        print(f"pdserve: serving {names}", flush=True)
        print(f"  HTTP (OpenAI): http://localhost:{config.http_port}/v1", flush=True)
        if gateway is not None:
            bound = (
                f"HAProxy, {gateway.per_replica} requests a router replica, "
                f"{gateway.max_connections()} connections"
            )
            print(f"  gateway:       {bound}", flush=True)
        print(f"  gRPC:          localhost:{config.grpc_port}", flush=True)
        print(f"  metrics:       http://localhost:{config.http_port}/metrics", flush=True)
        if prometheus is not None:
            print(f"  Prometheus:    {prometheus.url}", flush=True)
        if config.planner.enabled:
            print(f"  planner:       every {config.planner.interval_s:g} s", flush=True)
        print("  Ctrl-C stops the cluster", flush=True)
        stopping.wait()
    finally:
        print("pdserve: shutting down", flush=True)
        if gateway is not None:
            gateway.stop()
        if prometheus is not None:
            prometheus.stop()
        stop()
    return 0
