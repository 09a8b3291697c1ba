"""A Ray actor holding a tiny engine and its KV connector: one side of a transfer under test."""

import os
import time

import ray
import torch

from pdserve.engine.config import EngineConfig
from pdserve.engine.llm_engine import LLMEngine
from pdserve.engine.sampling_params import SamplingParams
from pdserve.kvtransfer.factory import make_connector
from pdserve.kvtransfer.faults import FaultSchedule, KVFault
from pdserve.kvtransfer.handles import KVExport, KVTransferError, PeerInfo
from pdserve.kvtransfer.layout import KVLayout

GREEDY = SamplingParams(temperature=0.0, max_tokens=1)
# Output tokens and, per position, the logprobs of the top tokens.
Generated = tuple[list[int], list[dict]]


@ray.remote(num_cpus=0)
class KVPeer:
    def __init__(self, model_dir: str, num_blocks: int, backend: str, **connector_args) -> None:
        engine_args = {
            key: connector_args.pop(key)
            for key in ("dtype", "block_size", "enable_prefix_caching")
            if key in connector_args
        }
        config = EngineConfig(model=model_dir, num_kv_blocks=num_blocks, **engine_args)
        self.engine = LLMEngine(config)
        layout = KVLayout.of("tiny", self.engine.model_config, config)
        self.connector = make_connector(
            self.engine.kv_cache, layout, self.engine.free_kv, backend, **connector_args
        )
        self._occupied: list[int] = []

    def inject(self, fault: KVFault) -> None:
        """Sets the fault this side applies from now on (kvtransfer/faults.py)."""
        self.connector.faults = FaultSchedule(fault)

    def info(self) -> PeerInfo:
        return self.connector.peer_info()

    def add_peer(self, info: PeerInfo) -> None:
        self.connector.add_peer(info)

    def occupy(self, num_blocks: int) -> None:
        """Takes blocks out of the pool, so later requests get other block ids than a peer's."""
        self._occupied += self.engine.block_pool.allocate(num_blocks)

    def vacate(self) -> None:
        self.engine.free_kv(self._occupied)
        self._occupied = []

    def prefill(self, prompt: list[int]) -> tuple[int, list[int]]:
        """Runs a real prefill; returns the first token and the blocks it holds for a peer."""
        self.engine.add_request("prefill", prompt, GREEDY, hold_kv=True)
        tokens, _ = self._run()
        return tokens[0], self.engine.take_held_kv("prefill")

    def export(self, block_ids: list[int]) -> KVExport:
        return self.connector.export(block_ids)

    def drop_lease(self, lease_id: str) -> None:
        self.connector.drop_lease(lease_id)

    def generate(self, prompt: list[int], params: SamplingParams) -> Generated:
        """The single-process reference: prefill and decode here."""
        self.engine.add_request("local", prompt, params)
        return self._run()

    def reserve(self, request_id: str, prompt: list[int], params: SamplingParams) -> list[int]:
        slots = self.engine.add_remote_prefilled(request_id, prompt, params)
        if slots is None or slots.num_cached_blocks:
            raise RuntimeError(f"expected blocks to fill, all of them, got {slots}")
        return slots.block_ids

    def pull(self, export: KVExport, block_ids: list[int]) -> None:
        self.connector.pull(export, block_ids).wait()

    def timed_pull(self, export: KVExport, block_ids: list[int]) -> tuple[str | None, float]:
        """Pulls; returns the error (None if it worked) and the seconds it took here."""
        start = time.monotonic()
        try:
            self.pull(export, block_ids)
        except KVTransferError as error:
            return str(error), time.monotonic() - start
        return None, time.monotonic() - start

    def decode(self, request_id: str, first_token: int) -> Generated:
        """Continues a request whose prompt KV has landed; returns all its output."""
        delta = self.engine.complete_remote_prefill(request_id, first_token)
        tokens, logprobs = self._run()
        return list(delta.outputs[0].token_ids) + tokens, logprobs

    def recompute(self, request_id: str) -> Generated:
        self.engine.recompute_remote_prefill(request_id)
        return self._run()

    def blocks(self, block_ids: list[int]) -> torch.Tensor:
        return self.engine.kv_cache[torch.tensor(block_ids)].clone()

    def poll(self) -> int:
        """Owner bookkeeping; returns the pool's free block count after it."""
        self.connector.poll()
        return self.engine.block_pool.num_free_blocks

    def pid(self) -> int:
        return os.getpid()

    def num_blocks(self) -> int:
        return self.engine.block_pool.num_blocks

    def stats(self) -> dict:
        return vars(self.connector.stats)

    def _run(self) -> Generated:
        """Steps until every request that can run has finished (not those awaiting KV)."""
        tokens, logprobs = [], []
        scheduler = self.engine.scheduler
        while scheduler.num_unfinished > len(scheduler.awaiting_kv):
            for delta in self.engine.step():
                tokens += delta.outputs[0].token_ids
                logprobs += delta.outputs[0].logprobs or []
        return tokens, logprobs
