"""Blocks an owner has exported stay pinned until the reader says it is done or the lease ends."""

import itertools
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

# How long an export's blocks wait for their reader (``kv_transfer.lease_seconds``).
DEFAULT_LEASE_SECONDS = 30.0


@dataclass
class _Lease:
    block_ids: list[int]
    expires_at: float  # time.monotonic() seconds of the owner's process: it alone reads it


class LeaseTable:
    def __init__(self, free_blocks: Callable[[list[int]], None], prefix: str) -> None:
        self._free_blocks = free_blocks
        self._prefix = prefix
        self._ids = itertools.count()
        self._leases: dict[str, _Lease] = {}
        # Block id -> leases pinning it: prefill replicas share cached prefix blocks, so two
        # leases can pin one block.
        self._pins: Counter[int] = Counter()

    def grant(self, block_ids: list[int], seconds: float) -> str:
        """Pins the blocks for ``seconds`` from now; returns the lease id."""
        lease_id = f"{self._prefix}:{next(self._ids)}"
        self._leases[lease_id] = _Lease(list(block_ids), time.monotonic() + seconds)
        self._pins.update(block_ids)
        return lease_id

    def release(self, lease_id: str) -> bool:
        """Frees a lease's blocks; False if it already ended (released or expired)."""
        lease = self._leases.pop(lease_id, None)
        if lease is None:
            return False
        self._pins.subtract(lease.block_ids)
        self._free_blocks(lease.block_ids)
        return True

    def expire(self, now: float | None = None) -> list[str]:
        """Frees every lease past its expiry; returns their ids."""
        now = time.monotonic() if now is None else now
        ended = [lease_id for lease_id, lease in self._leases.items() if lease.expires_at <= now]
        for lease_id in ended:
            self.release(lease_id)
        return ended

    def release_all(self) -> None:
        for lease_id in list(self._leases):
            self.release(lease_id)

    def is_pinned(self, block_id: int) -> bool:
        """Whether a lease still pins the block (during ``free_blocks``: another lease)."""
        return self._pins[block_id] > 0

    @property
    def num_pinned_blocks(self) -> int:
        return sum(len(lease.block_ids) for lease in self._leases.values())

    def __len__(self) -> int:
        return len(self._leases)
