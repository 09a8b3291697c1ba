"""The plain data peers exchange (through whatever RPC the caller uses) to move blocks."""

from dataclasses import dataclass
from typing import Any

from pdserve.kvtransfer.layout import KVLayout


class KVTransferError(RuntimeError):
    """A transfer failed or timed out, or a peer is gone; the caller may recompute instead."""


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


@dataclass(frozen=True)
class KVExport:
    """An owner's blocks, readable by a peer until ``expires_at`` (``time.time()`` seconds)."""

    owner: str
    block_ids: tuple[int, ...]
    lease_id: str
    expires_at: float
    payload: Any = None  # object-store backend: the ObjectRef of the blocks' contents
