"""KV transfer over NIXL with its UCX backend: the reader pulls blocks with one-sided READs.

The whole cache is registered once; each block is one descriptor (the layout is block-major), so a
transfer names blocks by index in two prepared descriptor lists, ours and the peer's, and is posted
a chunk at a time (``nixl_xfer``). A reader's READ carries ``release:<lease>`` as its notification,
so the owner frees the blocks when it is done. A checked pull (``integrity``) reads the owner's
generation counter of each block after the blocks, and carries the notification there instead: a
block the owner freed before the read ended has a newer generation. UCX's progress thread moves
the bytes and notifications whether or not the worker's loop is polling, and sleeps on UCX's
events when there are none.
"""

import dataclasses
import logging
from collections.abc import Callable

import torch

from pdserve.kvtransfer import nixl_shim
from pdserve.kvtransfer.connector import KVConnector
from pdserve.kvtransfer.handles import KVExport, PeerInfo
from pdserve.kvtransfer.integrity import check_generations
from pdserve.kvtransfer.layout import KVLayout
from pdserve.kvtransfer.nixl_xfer import ChunkedXfer
from pdserve.kvtransfer.transfer import Transfer

logger = logging.getLogger(__name__)

_RELEASE = "release"
# A transfer is posted this many bytes of blocks at a time, and each poll posts chunks for about
# this long (see nixl_xfer), so the engine loop never waits on a whole copy (docs/benchmarks.md,
# "KV transfer between two workers").
CHUNK_BYTES = 4 * 2**20
POST_BUDGET_SECONDS = 0.005
# The longest UCX's progress thread sleeps between looks when no event wakes it.
PROGRESS_DELAY_US = 10_000
# Rows of a connector's block generation counters: its own blocks' (peers read them), and the
# counters a read brought back from a peer, each at the index of the block it filled here.
_OWN, _READ = 0, 1
_GENERATION = torch.int64


class NixlConnector(KVConnector):
    backend = "nixl"

    def __init__(
        self,
        kv_cache: torch.Tensor,
        layout: KVLayout,
        free_blocks: Callable[[list[int]], None],
        chunk_bytes: int = CHUNK_BYTES,
        post_budget: float = POST_BUDGET_SECONDS,
        progress_delay_us: int = PROGRESS_DELAY_US,
        **kwargs,
    ) -> None:
        if not nixl_shim.nixl_available():
            raise RuntimeError(f"NIXL is not importable: {nixl_shim.IMPORT_ERROR}")
        # [2, blocks]: a block's own counter moves on each time no lease pins it any more.
        self._generations = torch.zeros(
            (2, kv_cache.shape[0]), dtype=_GENERATION, device=kv_cache.device
        )
        super().__init__(kv_cache, layout, self._advancing(free_blocks), **kwargs)
        self.chunk_bytes = chunk_bytes
        self.post_budget = post_budget
        self._agent = nixl_shim.make_agent(self.name, progress_delay_us)
        self._mem_type = "DRAM" if kv_cache.device.type == "cpu" else "VRAM"
        self._device_id = max(kv_cache.get_device(), 0)
        self._registered = [self._agent.register_memory(t) for t in (kv_cache, self._generations)]
        descriptors = self._descriptors(self.peer_info(), self._generations[_READ].data_ptr())
        self._local = self._agent.prep_xfer_dlist("NIXL_INIT_AGENT", descriptors, self._mem_type)
        self._remote: dict[str, object] = {}  # peer name -> its prepared descriptor list

    def peer_info(self) -> PeerInfo:
        return PeerInfo(
            name=self.name,
            backend=self.backend,
            layout=self.layout,
            num_blocks=self.num_blocks,
            block_bytes=self.block_bytes,
            agent_metadata=self._agent.get_agent_metadata(),
            base_address=self.kv_cache.data_ptr(),
            mem_type=self._mem_type,
            device_id=self._device_id,
            generations_address=self._generations[_OWN].data_ptr(),
        )

    def close(self) -> None:
        super().close()
        for name in self._remote:
            self._agent.remove_remote_agent(name)
        self._remote.clear()
        for registered in self._registered:
            self._agent.deregister_memory(registered)

    def export(self, block_ids: list[int]) -> KVExport:
        # Read before the lease exists: a fault may end it at once (faults: free_early).
        generations = tuple(self._generations[_OWN, block_ids].tolist())
        return dataclasses.replace(super().export(block_ids), generations=generations)

    def _connect(self, info: PeerInfo) -> None:
        with nixl_shim.explained(f"connecting to {info.name}"):
            self._agent.add_remote_agent(info.agent_metadata)
            self._remote[info.name] = self._agent.prep_xfer_dlist(
                info.name, self._descriptors(info, info.generations_address), info.mem_type
            )

    def _start_pull(
        self, export: KVExport, skip: int, block_ids: list[int], timeout: float
    ) -> Transfer:
        what = f"pull of {len(block_ids)} blocks from {export.owner}"
        remote_ids = list(export.block_ids[skip:])
        counters = None  # (ours, the owner's) descriptor indices of the blocks' generations
        if self.verify and export.generations:
            owner_blocks = self._peers[export.owner].num_blocks
            counters = (
                [self.num_blocks + i for i in block_ids],
                [owner_blocks + i for i in remote_ids],
            )
        xfer = ChunkedXfer(
            what,
            self._agent,
            self._local,
            block_ids,
            self._remote[export.owner],
            remote_ids,
            f"{_RELEASE}:{export.lease_id}".encode(),
            max(1, self.chunk_bytes // self.block_bytes),
            self.post_budget,
            last=counters,
        )

        def landed() -> bool:
            if not xfer.poll():
                return False
            if counters is not None:
                read = self._generations[_READ, block_ids].tolist()
                check_generations(what, read, export.generations[skip:])
            return True

        checked = self._checked(what, landed, export, skip, block_ids)
        transfer = self._transfer(
            what, checked, len(block_ids), timeout, on_end=lambda ok: xfer.release()
        )
        transfer.poll()  # posts the first chunk now: an owner that is gone fails this very call
        return transfer

    def release(self, export: KVExport) -> None:
        with nixl_shim.explained(f"release of {export.owner}'s blocks"):
            self._agent.send_notif(export.owner, f"{_RELEASE}:{export.lease_id}".encode())

    def _handle_notifications(self) -> None:
        for messages in self._agent.get_new_notifs().values():
            for message in messages:
                kind, _, key = message.decode().partition(":")
                if kind == _RELEASE:
                    self._leases.release(key)

    def _advancing(self, free_blocks: Callable[[list[int]], None]) -> Callable[[list[int]], None]:
        """``free_blocks``, moving on first the generation of each block no lease pins any more
        (one that another lease pins may still be read under it, and is not freed)."""

        def free(block_ids: list[int]) -> None:
            unpinned = [i for i in block_ids if not self._leases.is_pinned(i)]
            self._generations[_OWN, unpinned] += 1
            free_blocks(block_ids)

        return free

    @staticmethod
    def _descriptors(info: PeerInfo, generations_address: int) -> list[tuple[int, int, int]]:
        """A cache's blocks, then their generation counters: block i is descriptor i, its
        counter descriptor ``num_blocks + i``."""
        blocks = [
            (info.base_address + i * info.block_bytes, info.block_bytes, info.device_id)
            for i in range(info.num_blocks)
        ]
        size = _GENERATION.itemsize
        counters = [
            (generations_address + i * size, size, info.device_id) for i in range(info.num_blocks)
        ]
        return blocks + counters
