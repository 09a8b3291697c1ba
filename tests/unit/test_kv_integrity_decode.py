"""Checked KV on the decode replica's own path, without Ray: an ``AsyncLLMEngine`` (as
``DecodeWorker`` runs it) pulls a prompt's KV over NIXL through ``PeerPull`` from an owner engine
in this process. A corrupted, early-freed or reused block is caught, counted under "checksum",
and the prompt recomputed: the stream carries exactly the fault-free greedy tokens."""

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from pdserve.engine.async_engine import AsyncLLMEngine
from pdserve.engine.config import EngineConfig
from pdserve.engine.llm_engine import LLMEngine
from pdserve.engine.sampling_params import SamplingParams
from pdserve.kvtransfer.connector import KVConnector
from pdserve.kvtransfer.engine_hooks import ConnectorHooks, PeerPull
from pdserve.kvtransfer.factory import make_connector
from pdserve.kvtransfer.layout import KVLayout
from pdserve.kvtransfer.nixl_shim import nixl_available

pytestmark = pytest.mark.skipif(not nixl_available(), reason="NIXL not importable")

NUM_BLOCKS = 64
VOCAB_SIZE = 4096  # the tiny preset's
PARAMS = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
FIRST = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
TIMEOUT_S = 60.0


def connect(engine: LLMEngine, config: EngineConfig, fault: str) -> KVConnector:
    layout = KVLayout.of("tiny", engine.model_config, config)
    return make_connector(
        engine.kv_cache, layout, engine.free_kv, "nixl", timeout=10.0, fault_injection=fault
    )


class Decoder:
    """The decode side: an async engine whose KV hooks hold its connector."""

    def __init__(self, config: EngineConfig, fault: str) -> None:
        self.connectors: list[KVConnector] = []

        def hooks(engine: LLMEngine) -> ConnectorHooks:
            self.connectors.append(connect(engine, config, fault))
            return ConnectorHooks(self.connectors[0])

        self.engine = AsyncLLMEngine(config, kv_hooks=hooks)

    def tokens(self, request_id: str, prompt: list[int], remote_kv=None) -> list[int]:
        async def collect() -> list[int]:
            stream = self.engine.generate(request_id, prompt, PARAMS, remote_kv=remote_kv)
            return [t async for chunk in stream for t in chunk.outputs[0].token_ids]

        return asyncio.run(asyncio.wait_for(collect(), TIMEOUT_S))


@pytest.fixture
def prompt() -> list[int]:
    generator = torch.Generator().manual_seed(2)
    return torch.randint(0, VOCAB_SIZE, (100,), generator=generator).tolist()


@pytest.fixture
def config(tiny_model_dir: Path) -> EngineConfig:
    return EngineConfig(
        model=str(tiny_model_dir), num_kv_blocks=NUM_BLOCKS, enable_prefix_caching=False
    )


@pytest.fixture
def fault_free(config: EngineConfig, prompt: list[int]) -> list[int]:
    decoder = Decoder(config, "none")
    try:
        return decoder.tokens("local", prompt)
    finally:
        decoder.engine.shutdown()
        decoder.connectors[0].close()


def prefill(owner: LLMEngine, prompt: list[int]) -> tuple[int, list[int]]:
    owner.add_request("prefill", prompt, FIRST, hold_kv=True)
    tokens = []
    while owner.has_unfinished_requests():
        tokens += [t for delta in owner.step() for t in delta.outputs[0].token_ids]
    return tokens[0], owner.take_held_kv("prefill")


@pytest.fixture
def decoder(config: EngineConfig, request) -> Iterator[Decoder]:
    decoder = Decoder(config, request.param)
    yield decoder
    decoder.engine.shutdown()
    decoder.connectors[0].close()


@pytest.mark.parametrize("decoder", ["none", "corrupt", "free_early", "reuse"], indirect=True)
def test_integrity_the_decode_path_recomputes_what_landed_wrong(
    config, prompt, fault_free, decoder, caplog: pytest.LogCaptureFixture
) -> None:
    fault = decoder.connectors[0].faults.fault
    owner = LLMEngine(config)
    owner_connector = connect(owner, config, fault)
    first, blocks = prefill(owner, prompt)
    export = owner_connector.export(blocks)
    pull = PeerPull(decoder.connectors[0], owner_connector.peer_info(), export, first)
    try:
        assert decoder.tokens("pulled", prompt, remote_kv=pull) == fault_free
    finally:
        owner_connector.close()
    caught = fault != "none"
    assert decoder.engine.num_transfer_failures == caught
    assert decoder.connectors[0].stats.failures == ({"checksum": 1} if caught else {})
    assert decoder.connectors[0].stats.num_transfers == (not caught)
    # Logged once, in one line that says why: a transfer's own failure has no traceback.
    failed = [r for r in caplog.records if "KV transfer failed" in r.getMessage()]
    assert len(failed) == caught and all(r.exc_info is None for r in failed)
    assert all("blocks landed wrong" in r.getMessage() for r in failed), failed
