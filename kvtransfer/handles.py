"""The plain data peers exchange (through whatever RPC the caller uses) to move blocks."""

import time
from dataclasses import dataclass, field
from typing import Any

from pdserve.engine.errors import RemoteKVError
from pdserve.kvtransfer.layout import KVLayout


class KVTransferError(RemoteKVError):
    """A transfer failed or timed out, or a peer is gone; the caller may recompute instead."""

    reason = "error"  # the label it is counted under in ``kv_transfer_failures``


class KVIntegrityError(KVTransferError):
    """The blocks landed, but not as exported: a block's checksum differs (corrupted on the way,
    or overwritten under the read) or its owner freed it before the read was done."""

    reason = "checksum"


class IncompatiblePeerError(KVTransferError):
    """A peer's cache layout differs from ours; the message names each difference."""


@dataclass(frozen=True)
class PeerInfo:
    """A connector as its peers see it: who it is, how to reach it, and what its cache holds."""

    name: str
    backend: str
    layout: KVLayout
    num_blocks: int
    block_bytes: int
    agent_metadata: bytes = b""  # NIXL: the agent's metadata, for add_remote_agent
    base_address: int = 0  # NIXL: address of block 0 of the registered cache
    mem_type: str = "DRAM"  # NIXL: "DRAM" (CPU) or "VRAM" (GPU)
    device_id: int = 0
    generations_address: int = 0  # NIXL: address of the blocks' generation counters (int64 each)


@dataclass(frozen=True)
class KVExport:
    """An owner's blocks, readable by a peer for ``lease_seconds`` from ``since``.

    ``since`` is a ``time.monotonic()`` reading of the process holding this handle: no instant
    leaves its process, as hosts' clocks differ. Pickled, the handle carries the time its lease
    has left instead, and the process that unpickles it counts that from its arrival; each holder
    counts the time it held the handle, and only the time on the wire goes uncounted (the reader's
    ``LEASE_MARGIN_SECONDS`` allows for it).
    """

    owner: str
    block_ids: tuple[int, ...]
    lease_id: str
    lease_seconds: float
    payload: Any = None  # object-store backend: the ObjectRef of the blocks' contents
    # Per block, as exported: its XXH3-64 hash (empty when the owner does not verify) and, over
    # NIXL, its generation, which moves on when the owner frees it.
    checksums: tuple[int, ...] = ()
    generations: tuple[int, ...] = ()
    since: float = field(default_factory=time.monotonic, compare=False)

    def time_left(self) -> float:
        """Seconds until the owner frees the blocks (at the latest), on this process's clock."""
        return self.lease_seconds - (time.monotonic() - self.since)

    def __reduce__(self) -> tuple:
        fields = (self.owner, self.block_ids, self.lease_id, self.time_left(), self.payload)
        return KVExport, (*fields, self.checksums, self.generations)
