"""One worker replica's engine and KV connector, built the same way in both pools."""

import dataclasses

from ray import serve

from pdserve.cluster.config import ServedModel
from pdserve.engine.async_engine import AsyncLLMEngine
from pdserve.engine.llm_engine import LLMEngine
from pdserve.kvtransfer import KVConnector, KVLayout, make_connector
from pdserve.kvtransfer.engine_hooks import ConnectorHooks


def start_engine(served: ServedModel) -> tuple[AsyncLLMEngine, KVConnector]:
    """Loads the model, starts the engine thread and registers its KV cache for transfer."""
    config = served.engine_config()
    connectors: list[KVConnector] = []

    def hooks(engine: LLMEngine) -> ConnectorHooks:
        layout = KVLayout.of(served.name, engine.model_config, config)
        transfer = served.kv_transfer
        connector = make_connector(
            engine.kv_cache,
            layout,
            engine.free_kv,
            transfer.backend,
            lease_seconds=transfer.lease_seconds,
            timeout=transfer.timeout_seconds,
        )
        connectors.append(connector)
        return ConnectorHooks(connector)

    engine = AsyncLLMEngine(config, kv_hooks=hooks)
    return engine, connectors[0]


def replica_stats(engine: AsyncLLMEngine, connector: KVConnector) -> dict:
    """A replica's state for routing and tests: engine stats, transfer counters, its id."""
    return {
        "replica": serve.get_replica_context().replica_id.unique_id,
        **dataclasses.asdict(engine.stats),
        "kv_pinned_blocks": connector.num_pinned_blocks,
        "kv_transfer_failures": engine.num_transfer_failures,
        **{f"kv_{name}": value for name, value in vars(connector.stats).items()},
    }


def routing_stats(engine: AsyncLLMEngine, connector: KVConnector) -> dict:
    """What the KV-aware router reads: the replica's stats and its prefix cache's hashes."""
    return {**replica_stats(engine, connector), "cached_block_hashes": engine.cached_hashes}
