"""One side of the KV-transfer benchmark: a Ray actor with a KV cache and a connector per kind of
transfer (backend, with or without its integrity checks).

No engine: the cache has a model's layout and, on the owner's side, random contents, so a wrong
or partial copy shows in the digests. Each method returns the seconds its connector calls took,
and the longest of those calls, measured in the actor, so Ray's call overhead stays out of them;
the driver's functions below time a transfer that way and end to end, Ray's calls included.
"""

import argparse
import hashlib
import time
from collections.abc import Callable
from functools import partial

import ray
import torch
from ray.actor import ActorHandle

from pdserve.benchmarks.kv_transfer import TRANSFERS, Mode, Timed, TransferKind
from pdserve.engine.config import EngineConfig, ModelConfig
from pdserve.engine.kv_cache import allocate_kv_cache
from pdserve.kvtransfer.factory import make_connector
from pdserve.kvtransfer.handles import KVExport, PeerInfo
from pdserve.kvtransfer.layout import KVLayout
from pdserve.kvtransfer.transfer import Transfer

POLL_INTERVAL = 0.0005  # seconds between a transfer's polls, as Transfer.wait's
# Connector seconds and the longest single call among them.
Calls = tuple[float, float]


def _keep_blocks(block_ids: list[int]) -> None:
    """No block pool here: freed blocks stay where they are for the next repetition."""


def _timed_wait(start: Callable[[], Transfer]) -> Calls:
    """Starts a transfer and polls it to the end, as ``Transfer.wait`` does, timing each call."""
    began = time.perf_counter()
    transfer = start()
    longest = time.perf_counter() - began
    while True:
        call = time.perf_counter()
        done = transfer.poll()
        longest = max(longest, time.perf_counter() - call)
        if done:
            return time.perf_counter() - began, longest
        time.sleep(POLL_INTERVAL)


@ray.remote(num_cpus=0)
class BenchPeer:
    def __init__(
        self, model_dir: str, num_blocks: int, block_size: int, timeout: float, seed: int | None
    ) -> None:
        model = ModelConfig.from_pretrained(model_dir)
        engine = EngineConfig(model=model_dir, block_size=block_size)
        # [num_blocks, layers, 2, block_size, kv_heads, head_dim]
        self.kv_cache = allocate_kv_cache(model, engine, num_blocks)
        if seed is not None:
            self.kv_cache.normal_(generator=torch.Generator().manual_seed(seed))
        layout = KVLayout.of(model_dir, model, engine)
        self.connectors = {
            kind: make_connector(
                self.kv_cache,
                layout,
                _keep_blocks,
                kind.backend,
                timeout=timeout,
                verify=kind.verify,
            )
            for kind in TRANSFERS.values()
        }

    def info(self, kind: TransferKind) -> PeerInfo:
        return self.connectors[kind].peer_info()

    def add_peer(self, kind: TransferKind, info: PeerInfo) -> None:
        self.connectors[kind].add_peer(info)

    def export(self, kind: TransferKind, block_ids: list[int]) -> tuple[KVExport, float]:
        connector = self.connectors[kind]
        connector.poll()  # as an engine loop would: ends the leases of earlier pulls
        start = time.perf_counter()
        export = connector.export(block_ids)
        return export, time.perf_counter() - start

    def pull(self, kind: TransferKind, export: KVExport, block_ids: list[int]) -> Calls:
        return _timed_wait(lambda: self.connectors[kind].pull(export, block_ids))

    def clear(self, block_ids: list[int]) -> None:
        self.kv_cache[torch.tensor(block_ids)] = 0

    def digest(self, block_ids: list[int]) -> str:
        """A hash of the blocks' bytes, in the order given."""
        blocks = self.kv_cache[torch.tensor(block_ids)]  # a gathered copy
        return hashlib.blake2b(blocks.view(torch.uint8).numpy()).hexdigest()

    def num_threads(self) -> int:
        return torch.get_num_threads()

    def idle_cpu(self, seconds: float) -> float:
        """This process's CPU seconds per second while its connectors sit idle, all threads."""
        start = time.process_time()
        time.sleep(seconds)
        return (time.process_time() - start) / seconds


def start_peers(
    model_dir: str, num_blocks: int, args: argparse.Namespace
) -> tuple[ActorHandle, ActorHandle]:
    """An owner of ``num_blocks`` random blocks and a reader of twice as many, connected."""
    owner = BenchPeer.remote(model_dir, num_blocks, args.block_size, args.timeout, args.seed)
    reader = BenchPeer.remote(model_dir, 2 * num_blocks, args.block_size, args.timeout, None)
    for kind in TRANSFERS.values():
        ray.get(reader.add_peer.remote(kind, ray.get(owner.info.remote(kind))))
    return owner, reader


def idle_cpu(owner: ActorHandle, reader: ActorHandle, seconds: float) -> tuple[float, float]:
    """Each actor's share of a core over the same ``seconds`` of doing nothing."""
    return tuple(ray.get([owner.idle_cpu.remote(seconds), reader.idle_cpu.remote(seconds)]))


def pull_once(
    owner: ActorHandle, reader: ActorHandle, kind: TransferKind, src: list[int], dst: list[int]
) -> Timed:
    start = time.perf_counter()
    export, export_s = ray.get(owner.export.remote(kind, src))
    pull_s, longest = ray.get(reader.pull.remote(kind, export, dst))
    return Timed(export_s + pull_s, max(export_s, longest), time.perf_counter() - start)


def transfer_modes(
    owner: ActorHandle, reader: ActorHandle, src: list[int], dst: list[int]
) -> list[Mode]:
    """Each of ``TRANSFERS``, from the owner's blocks ``src`` into the reader's ``dst``."""

    def clear() -> None:
        ray.get(reader.clear.remote(dst))

    def landed() -> bool:
        return ray.get(owner.digest.remote(src)) == ray.get(reader.digest.remote(dst))

    return [
        Mode(name, partial(pull_once, owner, reader, kind, src, dst), clear, landed)
        for name, kind in TRANSFERS.items()
    ]
