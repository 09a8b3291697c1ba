"""The fallback: KV blocks travel through Ray's object store, where NIXL is not installed.

An export copies the blocks into one object at once and frees them: the object, not the cache,
carries the bytes from then on, and Ray frees it when the last holder of the export drops it. Each
side copies once: the owner block by block into the object store, the reader out of it straight
into its blocks. So this backend needs no lease and no notification; if the owner dies, Ray loses
the object and the reader's transfer fails with the owner's death as its cause. The blocks'
checksums are taken just before the copy, and checked once the reader has copied them in.
"""

import warnings

import ray
import torch

from pdserve.kvtransfer.connector import KVConnector
from pdserve.kvtransfer.handles import KVExport, PeerInfo
from pdserve.kvtransfer.transfer import PollFn, Transfer


class ObjectStoreConnector(KVConnector):
    backend = "object_store"

    def peer_info(self) -> PeerInfo:
        return PeerInfo(self.name, self.backend, self.layout, self.num_blocks, self.block_bytes)

    def export(self, block_ids: list[int]) -> KVExport:
        checksums = self._checksums(block_ids)
        self._inject_reuse(block_ids)
        payload = self._put(block_ids)
        self._free_blocks(block_ids)
        return KVExport(self.name, tuple(block_ids), "", float("inf"), payload, checksums)

    def _connect(self, info: PeerInfo) -> None:
        """Nothing to set up: Ray already connects every worker."""

    def _handle_notifications(self) -> None:
        """Nothing to hear: exports hold no lease."""

    def _start_pull(
        self, export: KVExport, skip: int, block_ids: list[int], timeout: float
    ) -> Transfer:
        what = f"pull of {len(block_ids)} blocks from {export.owner}"
        arrived = self._copy_in(export.payload, block_ids, skip)
        checked = self._checked(what, arrived, export, skip, block_ids)
        return self._transfer(what, checked, len(block_ids), timeout)

    def release(self, export: KVExport) -> None:
        """Nothing to tell: the owner freed its blocks at export."""

    def _put(self, block_ids: list[int]) -> ray.ObjectRef:
        # One view per block, as bytes (numpy has no bfloat16): Ray pickles them out of band, so
        # each block is copied once, straight into the object store, with no gathered temporary.
        return ray.put([self.kv_cache[i].cpu().view(torch.uint8).numpy() for i in block_ids])

    def _copy_in(self, payload: ray.ObjectRef, block_ids: list[int], skip: int) -> PollFn:
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

        return arrived
