"""The fallback: KV blocks travel through Ray's object store, where NIXL is not installed.

An export copies the blocks into one object at once and frees them: the object, not the cache,
carries the bytes from then on, and Ray frees it when the last holder of the export drops it. Each
side copies once: the owner block by block into the object store, the reader out of it straight
into its blocks. So this backend needs no lease and no notification; if the owner dies, Ray loses
the object and the reader's transfer fails with the owner's death as its cause. A push is the same
copy, handed to the reader inside the receipt.
"""

import warnings

import ray
import torch

from pdserve.kvtransfer.connector import KVConnector
from pdserve.kvtransfer.handles import KVExport, PeerInfo, PushReceipt, PushTarget
from pdserve.kvtransfer.transfer import Transfer


class ObjectStoreConnector(KVConnector):
    backend = "object_store"

    def peer_info(self) -> PeerInfo:
        return PeerInfo(self.name, self.backend, self.layout, self.num_blocks, self.block_bytes)

    def export(self, block_ids: list[int]) -> KVExport:
        payload = self._put(block_ids)
        self._free_blocks(block_ids)
        return KVExport(self.name, tuple(block_ids), "", float("inf"), payload)

    def push(self, target: PushTarget, block_ids: list[int]) -> tuple[Transfer, PushReceipt]:
        self.add_peer(target.reader)
        self._check_lengths(len(block_ids), len(target.block_ids))
        receipt = PushReceipt(self.name, target.transfer_id, self._put(block_ids))
        self._free_blocks(block_ids)
        transfer = self._transfer(
            f"push of {len(block_ids)} blocks to {target.reader.name}", lambda: True, 0
        )
        return transfer, receipt

    def receive_push(self, target: PushTarget, receipt: PushReceipt) -> Transfer:
        return self._copy_in(
            f"push of {len(target.block_ids)} blocks from {receipt.owner}",
            receipt.payload,
            list(target.block_ids),
            self.timeout,
            0,
        )

    def _connect(self, info: PeerInfo) -> None:
        """Nothing to set up: Ray already connects every worker."""

    def _handle_notifications(self) -> None:
        """Nothing to hear: exports hold no lease, and a push's bytes ride in its receipt."""

    def _start_pull(
        self, export: KVExport, skip: int, block_ids: list[int], timeout: float
    ) -> Transfer:
        what = f"pull of {len(block_ids)} blocks from {export.owner}"
        return self._copy_in(what, export.payload, block_ids, timeout, skip)

    def release(self, export: KVExport) -> None:
        """Nothing to tell: the owner freed its blocks at export."""

    def _put(self, block_ids: list[int]) -> ray.ObjectRef:
        # One view per block, as bytes (numpy has no bfloat16): Ray pickles them out of band, so
        # each block is copied once, straight into the object store, with no gathered temporary.
        return ray.put([self.kv_cache[i].cpu().view(torch.uint8).numpy() for i in block_ids])

    def _copy_in(
        self, what: str, payload: ray.ObjectRef, block_ids: list[int], timeout: float, skip: int
    ) -> Transfer:
        def arrived() -> bool:
            ready, _ = ray.wait([payload], timeout=0)
            if not ready:
                return False
            blocks = ray.get(payload)  # raises if the owner died and took the object with it
            with warnings.catch_warnings():  # read-only shared memory: we only read it
                warnings.simplefilter("ignore", UserWarning)
                for block_id, block in zip(block_ids, blocks[skip:], strict=True):
                    self.kv_cache[block_id].view(torch.uint8).copy_(torch.from_numpy(block))
            return True

        return self._transfer(what, arrived, len(block_ids), timeout)
