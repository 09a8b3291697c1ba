"""The deployment config: one typed schema for the CLI, Serve YAML (``build_app`` args) and tests.

pydantic validates at the YAML/CLI edge; the engine still takes its frozen ``EngineConfig``,
built here from each model's ``engine`` section (the same names as ``EngineConfig``'s fields).
"""

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    SecretStr,
    field_validator,
    model_validator,
)

from pdserve.engine.config import (
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    DEFAULT_MAX_NUM_SEQS,
    GENERATION_CONFIG_NAMES,
    EngineConfig,
)
from pdserve.kvtransfer.faults import NO_FAULT, KVFault
from pdserve.kvtransfer.leases import DEFAULT_LEASE_SECONDS
from pdserve.kvtransfer.transfer import DEFAULT_TIMEOUT_SECONDS

DEFAULT_HTTP_PORT = 8000
DEFAULT_GRPC_PORT = 9000
# Prompts with fewer uncached tokens than this prefill on the decode replica (aggregated path).
DEFAULT_LOCAL_PREFILL_MAX_TOKENS = 128
DEFAULT_ROUTING_STATS_PERIOD_S = 0.5
# A prefill replica with this many prompt tokens queued is saturated: two of the engine's default
# steps (max_num_batched_tokens).
DEFAULT_PREFILL_QUEUE_MAX_TOKENS = 2 * DEFAULT_MAX_NUM_BATCHED_TOKENS
DEFAULT_MAX_ONGOING_REQUESTS = DEFAULT_MAX_NUM_SEQS  # a replica's calls: what its engine batches
# A replica being removed (scale-down, redeploy) takes no new requests and has this long to finish
# its streams: a 1,000-token completion at 50 ms a token (Serve's own default is 20 s).
DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT_S = 60.0
DEFAULT_ROUTER_MAX_ONGOING_REQUESTS = 4096  # the router holds streams, no KV
DEFAULT_ROUTER_TARGET_ONGOING_REQUESTS = 256  # a router replica's share of the streams
# Requests of one model the router has in flight before it answers 429 (TGI's name for the knob):
# four decode replicas' worth of the engine's default max_num_seqs.
DEFAULT_MAX_CONCURRENT_REQUESTS = 4 * DEFAULT_MAX_NUM_SEQS
DEFAULT_LOG_STATS_INTERVAL_S = 10.0  # vLLM's
DEFAULT_MIGRATION_LIMIT = 3  # a request outlives this many lost decode replicas (Dynamo's knob)
DEFAULT_PROMETHEUS_PORT = 9090  # Prometheus' own
DEFAULT_PLANNER_INTERVAL_S = 30.0


def absolute_path(path: str) -> str:
    """``path`` made absolute against this process's working directory: the processes Ray starts
    work elsewhere (cluster/ray_driver.py)."""
    return os.path.abspath(os.path.expanduser(path))


ROUTER_DEPLOYMENT = "router"  # the Serve deployment of the router, every model's


def pool_deployment(role: str, model: str) -> str:
    """The Serve deployment of ``model``'s ``role`` ("prefill" or "decode") pool."""
    return f"{role}-{model}"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Replicas(_Strict):
    """A deployment's replicas at the start, and the bounds something may move them within."""

    replicas: int = Field(1, ge=0)
    # The scaler's bounds (none: `replicas`, so a deployment no scaler may move stays put).
    min_replicas: int | None = Field(None, ge=0)
    max_replicas: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _bounds_hold_the_start(self) -> "_Replicas":
        if not self.lowest <= self.replicas <= self.highest:
            raise ValueError(
                f"need min_replicas <= replicas <= max_replicas, got {self.lowest} <= "
                f"{self.replicas} <= {self.highest}"
            )
        return self

    @property
    def lowest(self) -> int:
        return self.replicas if self.min_replicas is None else self.min_replicas

    @property
    def highest(self) -> int:
        return self.replicas if self.max_replicas is None else self.max_replicas


class PoolConfig(_Replicas):
    """One worker pool: how many replicas (the planner moves them within the bounds), and what
    each needs from Ray."""

    num_cpus: float = Field(0.0, ge=0)  # a replica's engine thread shares the node's cores
    # Cores the replicas are pinned to, the replica of rank r to cpus[r % len(cpus)] (Linux): a
    # replica then computes on its own core, as in a comparison at equal cores. Empty: unpinned.
    cpus: list[NonNegativeInt] = []
    # Serve's cap on calls in flight to one replica (its own default, 5, would starve the engine's
    # continuous batching); past it, requests wait in Serve's queue rather than the engine's.
    max_ongoing_requests: int = Field(DEFAULT_MAX_ONGOING_REQUESTS, ge=1)
    resources: dict[str, float] = {}  # custom Ray resources, e.g. {"prefill_node": 1}
    graceful_shutdown_timeout_s: float = Field(DEFAULT_GRACEFUL_SHUTDOWN_TIMEOUT_S, ge=0)


class RouterConfig(_Replicas):
    """The router deployment. Its replicas share nothing: each holds the streams Serve's proxies
    gave it and bounds each model's requests in flight by ``max_concurrent_requests`` on its own.
    With ``max_replicas`` above ``min_replicas``, Serve's autoscaler sizes it by the requests its
    replicas hold (not beside the planner: Serve runs no autoscaler beside an external scaler)."""

    replicas: int = Field(1, ge=1)
    min_replicas: int | None = Field(None, ge=1)
    # Serve's autoscaling target: requests in flight per router replica.
    target_ongoing_requests: float = Field(DEFAULT_ROUTER_TARGET_ONGOING_REQUESTS, gt=0)
    # Serve's cap on requests in flight through one router replica; past it Serve queues them.
    max_ongoing_requests: int = Field(DEFAULT_ROUTER_MAX_ONGOING_REQUESTS, ge=1)
    # Custom Ray resources each replica needs, e.g. {"router_node": 0.01} where only the head node
    # offers router_node: the routers beside Serve's proxy, not on a worker a lost host takes with
    # its streams. Empty: any node.
    resources: dict[str, float] = {}

    @property
    def autoscaled(self) -> bool:
        return self.highest > self.lowest


class RoutingConfig(_Strict):
    # "kv_aware": router/dispatch/kv_routing.py; "power_of_two": Serve's default (load only), the
    # baseline.
    policy: Literal["kv_aware", "power_of_two"] = "kv_aware"
    # Remote prefill only when the prompt's part not cached at its decode replica is this long.
    local_prefill_max_tokens: int = Field(DEFAULT_LOCAL_PREFILL_MAX_TOKENS, ge=0)
    # When every prefill replica has this many prompt tokens queued, prompts prefill locally.
    prefill_queue_max_tokens: int = Field(DEFAULT_PREFILL_QUEUE_MAX_TOKENS, ge=1)
    kv_overlap_weight: float = Field(1.0, ge=0)  # score of each cached prompt token
    load_weight: float = Field(1.0, ge=0)  # penalty of each queued prompt token / running sequence
    stats_period_s: float = Field(DEFAULT_ROUTING_STATS_PERIOD_S, gt=0)


class SLAConfig(_Strict):
    """A model's latency targets: the planner sizes its pools to them, the alerts watch them."""

    ttft_ms: float = Field(500.0, gt=0)
    itl_ms: float = Field(50.0, gt=0)


class PlannerConfig(_Strict):
    """The SLA planner (``cluster/planner/``): sizes each model's pools to its ``sla``."""

    enabled: bool = False
    interval_s: float = Field(DEFAULT_PLANNER_INTERVAL_S, gt=0)
    # None: the Prometheus `pdserve serve --prometheus` starts on this machine.
    prometheus_url: str | None = None
    profile: str | None = None  # `pdserve profile`'s JSON; needed when enabled
    max_step: int = Field(1, ge=1)  # most replicas a pool gains or loses per interval
    scale_down_intervals: int = Field(2, ge=1)  # intervals in a row wanting fewer, then down
    # Custom Ray resources the planner's replica needs, e.g. {"router_node": 0.01} where only the
    # head offers it: the planner beside the Prometheus on the head's loopback. Empty: any node.
    resources: dict[str, float] = {}

    @field_validator("profile")
    @classmethod
    def _profile_is_absolute(cls, path: str | None) -> str | None:
        return None if path is None else absolute_path(path)

    @model_validator(mode="after")
    def _profile_when_enabled(self) -> "PlannerConfig":
        if self.enabled and self.profile is None:
            raise ValueError("planner.profile is needed when the planner is enabled")
        return self

    @property
    def prometheus(self) -> str:
        return self.prometheus_url or f"http://127.0.0.1:{DEFAULT_PROMETHEUS_PORT}"


class KVTransferConfig(_Strict):
    """Decode replicas pull (NIXL READ); a failed transfer is recomputed on the decode replica."""

    backend: Literal["auto", "nixl", "object_store"] = "auto"
    lease_seconds: float = Field(DEFAULT_LEASE_SECONDS, gt=0)
    timeout_seconds: float = Field(DEFAULT_TIMEOUT_SECONDS, gt=0)
    # Checksum each exported block and check it, with its lease's generation, where it lands; a
    # block that landed wrong is recomputed (kvtransfer/integrity.py). Off only to measure it.
    verify: bool = True
    # Test-only: break one transfer in `fault_every` this way (kvtransfer/faults.py; each
    # replica counts its own). Never set in production.
    fault_injection: KVFault = NO_FAULT
    fault_every: int = Field(1, ge=1)


class ServedModel(_Strict):
    """One served model: where it is, its engine knobs and its two pools."""

    name: str
    path: str
    engine: dict[str, Any] = {}  # EngineConfig fields except `model`
    prefill: PoolConfig = PoolConfig()
    decode: PoolConfig = PoolConfig()
    routing: RoutingConfig = RoutingConfig()
    kv_transfer: KVTransferConfig = KVTransferConfig()
    sla: SLAConfig = SLAConfig()
    # Export the model's metrics from its replicas and the router (off: a same-run baseline).
    metrics: bool = True
    # Each replica logs a stats line this often while it has work (vLLM's); 0 turns it off.
    log_stats_interval_s: float = Field(DEFAULT_LOG_STATS_INTERVAL_S, ge=0)
    # A request whose decode replica dies goes on at another this many times
    # (router/dispatch/migration.py).
    migration_limit: int = Field(DEFAULT_MIGRATION_LIMIT, ge=0)
    # Past this many of the model's requests in flight in one router replica, one more gets 429
    # at once.
    max_concurrent_requests: int = Field(DEFAULT_MAX_CONCURRENT_REQUESTS, ge=1)

    @field_validator("path")
    @classmethod
    def _path_is_absolute(cls, path: str) -> str:
        return absolute_path(path)

    @field_validator("decode")
    @classmethod
    def _decode_pool_is_not_empty(cls, decode: PoolConfig) -> PoolConfig:
        if decode.replicas < 1:
            raise ValueError("decode.replicas must be >= 1: decode replicas serve every request")
        return decode

    @field_validator("engine")
    @classmethod
    def _engine_args_are_known(cls, engine: dict[str, Any]) -> dict[str, Any]:
        unknown = set(engine) - (set(EngineConfig.__dataclass_fields__) - {"model"})
        if unknown:
            raise ValueError(f"unknown engine args: {', '.join(sorted(unknown))}")
        return engine

    @field_validator("engine")
    @classmethod
    def _generation_config_folder_is_absolute(cls, engine: dict[str, Any]) -> dict[str, Any]:
        source = engine.get("generation_config")
        if not isinstance(source, str) or source in GENERATION_CONFIG_NAMES:
            return engine
        return {**engine, "generation_config": absolute_path(source)}

    def engine_config(self) -> EngineConfig:
        """The engine's own frozen config; raises ValueError on bad values."""
        return EngineConfig(model=self.path, **self.engine)

    @property
    def disaggregated(self) -> bool:
        return self.prefill.replicas > 0


class ClusterConfig(_Strict):
    models: list[ServedModel] = Field(min_length=1)
    http_host: str = "0.0.0.0"
    http_port: int = DEFAULT_HTTP_PORT
    grpc_port: int = DEFAULT_GRPC_PORT
    router: RouterConfig = RouterConfig()
    planner: PlannerConfig = PlannerConfig()
    # Bearer keys the router accepts (none: open). Secret: masked in reprs and JSON dumps; the
    # router replica gets only their digests (cluster/app.py).
    api_keys: list[SecretStr] = []

    @field_validator("models")
    @classmethod
    def _names_are_unique(cls, models: list[ServedModel]) -> list[ServedModel]:
        names = [m.name for m in models]
        if len(set(names)) != len(names):
            raise ValueError(f"model names must be unique, got {names}")
        return models

    @model_validator(mode="after")
    def _router_refuses_before_serve_queues(self) -> "ClusterConfig":
        # Past the router's max_ongoing_requests, Serve queues requests for a router replica
        # without bound; the models' limits must be reached first, with room left to answer 429s
        # and probes.
        admitted = sum(m.max_concurrent_requests for m in self.models)
        if admitted >= self.router.max_ongoing_requests:
            raise ValueError(
                f"router.max_ongoing_requests ({self.router.max_ongoing_requests}) must exceed "
                f"the models' max_concurrent_requests together ({admitted})"
            )
        return self

    @model_validator(mode="after")
    def _one_scaler(self) -> "ClusterConfig":
        if self.planner.enabled and self.router.autoscaled:
            raise ValueError(
                "the planner is an external scaler, beside which Serve autoscales nothing: give "
                f"the router a fixed count (router.replicas), not {self.router.lowest} to "
                f"{self.router.highest}"
            )
        return self

    @classmethod
    def from_yaml(cls, path: str | Path) -> "ClusterConfig":
        return cls.model_validate(yaml.safe_load(Path(path).read_text()))
