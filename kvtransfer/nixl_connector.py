"""KV transfer over NIXL with its UCX backend: one-sided READ (pull) or WRITE (push) of blocks.

The whole cache is registered once; each block is one descriptor (the layout is block-major), so a
transfer names blocks by index in two prepared descriptor lists, ours and the peer's, and is posted
a chunk at a time (``nixl_xfer``). A reader's READ carries ``release:<lease>`` as its notification,
so the owner frees the blocks when it is done; an owner's WRITE carries ``push:<transfer id>`` so
the reader knows the bytes have landed. UCX's progress thread moves the bytes and notifications
whether or not the worker's loop is polling, and sleeps on UCX's events when there are none.
"""

import logging
from collections.abc import Callable

import torch

from pdserve.kvtransfer import nixl_shim
from pdserve.kvtransfer.connector import KVConnector
from pdserve.kvtransfer.handles import (
    KVExport,
    PeerInfo,
    PushReceipt,
    PushTarget,
)
from pdserve.kvtransfer.layout import KVLayout
from pdserve.kvtransfer.nixl_xfer import ChunkedXfer
from pdserve.kvtransfer.transfer import Transfer

logger = logging.getLogger(__name__)

_RELEASE = "release"
_PUSHED = "push"
# A transfer is posted this many bytes of blocks at a time, and each poll posts chunks for about
# this long (see nixl_xfer): over cma, 4 MiB is a few ms of copying.
CHUNK_BYTES = 4 * 2**20
POST_BUDGET_SECONDS = 0.005
# The longest UCX's progress thread sleeps between looks when no event wakes it.
PROGRESS_DELAY_US = 10_000


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
        super().__init__(kv_cache, layout, free_blocks, **kwargs)
        self.chunk_bytes = chunk_bytes
        self.post_budget = post_budget
        self._agent = nixl_shim.make_agent(self.name, progress_delay_us)
        self._mem_type = "DRAM" if kv_cache.device.type == "cpu" else "VRAM"
        self._device_id = max(kv_cache.get_device(), 0)
        self._registered = self._agent.register_memory(kv_cache)
        self._local = self._agent.prep_xfer_dlist(
            "NIXL_INIT_AGENT", self._descriptors(self.peer_info()), self._mem_type
        )
        self._remote: dict[str, object] = {}  # peer name -> its prepared descriptor list
        self._pushed: set[str] = set()  # transfer ids whose push has landed here

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
        )

    def push(self, target: PushTarget, block_ids: list[int]) -> tuple[Transfer, PushReceipt]:
        self.add_peer(target.reader)
        self._check_lengths(len(block_ids), len(target.block_ids))
        # Pinned until the write ends either way: the engine must not reuse blocks being read.
        lease_id, _ = self._leases.grant(block_ids, self.lease_seconds)
        transfer = self._post(
            "WRITE",
            f"push of {len(block_ids)} blocks to {target.reader.name}",
            target.reader.name,
            block_ids,
            list(target.block_ids),
            f"{_PUSHED}:{target.transfer_id}",
            self.timeout,
            on_end=lambda ok: self._leases.release(lease_id),
        )
        return transfer, PushReceipt(self.name, target.transfer_id)

    def receive_push(self, target: PushTarget, receipt: PushReceipt) -> Transfer:
        def landed() -> bool:
            self._handle_notifications()
            if receipt.transfer_id in self._pushed:
                self._pushed.remove(receipt.transfer_id)
                return True
            return False

        return self._transfer(
            f"push of {len(target.block_ids)} blocks from {receipt.owner}",
            landed,
            len(target.block_ids),
        )

    def close(self) -> None:
        super().close()
        for name in self._remote:
            self._agent.remove_remote_agent(name)
        self._remote.clear()
        self._agent.deregister_memory(self._registered)

    def _connect(self, info: PeerInfo) -> None:
        self._agent.add_remote_agent(info.agent_metadata)
        self._remote[info.name] = self._agent.prep_xfer_dlist(
            info.name, self._descriptors(info), info.mem_type
        )

    def _start_pull(
        self, export: KVExport, skip: int, block_ids: list[int], timeout: float
    ) -> Transfer:
        return self._post(
            "READ",
            f"pull of {len(block_ids)} blocks from {export.owner}",
            export.owner,
            block_ids,
            list(export.block_ids[skip:]),
            f"{_RELEASE}:{export.lease_id}",
            timeout,
        )

    def release(self, export: KVExport) -> None:
        self._agent.send_notif(export.owner, f"{_RELEASE}:{export.lease_id}".encode())

    def _post(
        self,
        op: str,
        what: str,
        peer: str,
        local_ids: list[int],
        remote_ids: list[int],
        notification: str,
        timeout: float,
        on_end: Callable[[bool], None] | None = None,
    ) -> Transfer:
        xfer = ChunkedXfer(
            what,
            self._agent,
            op,
            self._local,
            local_ids,
            self._remote[peer],
            remote_ids,
            notification.encode(),
            max(1, self.chunk_bytes // self.block_bytes),
            self.post_budget,
        )

        def end(ok: bool) -> None:
            xfer.release()
            if on_end is not None:
                on_end(ok)

        transfer = self._transfer(what, xfer.poll, len(local_ids), timeout, end)
        transfer.poll()  # posts the first chunk now: a peer that is gone fails this very call
        return transfer

    def _handle_notifications(self) -> None:
        for messages in self._agent.get_new_notifs().values():
            for message in messages:
                kind, _, key = message.decode().partition(":")
                if kind == _RELEASE:
                    self._leases.release(key)
                elif kind == _PUSHED:
                    self._pushed.add(key)

    @staticmethod
    def _descriptors(info: PeerInfo) -> list[tuple[int, int, int]]:
        return [
            (info.base_address + i * info.block_bytes, info.block_bytes, info.device_id)
            for i in range(info.num_blocks)
        ]
