"""Fault injection for the KV integrity tests and the chaos benchmark: test-only, off (``none``)
in production.

``kv_transfer.fault_injection`` (serving/config.py, the one place it is set) reaches every
connector of the model, and each applies the faults of its role to every transfer, or with
``kv_transfer.fault_every`` N to every N-th of its transfers:

- ``corrupt``: the reader flips one bit of the first block it received, as a bad link would,
  before checking it.
- ``free_early``: the owner ends the lease as it grants it, so its blocks are free (their
  generation moves on) while the reader reads them. NIXL only: the object store copies the blocks
  at export and frees them at once by design, so no read can see them freed.
- ``reuse``: the owner overwrites the first exported block with other data after taking its
  checksum, as if another request had been handed the block before the read.
"""

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # serving/config.py reads KVFault in the router, which imports no torch
    import torch

KVFault = Literal["none", "corrupt", "free_early", "reuse"]
NO_FAULT: KVFault = "none"


def flip_a_bit(kv_cache: "torch.Tensor", block_id: int) -> None:
    kv_cache[block_id].view(-1)[:1].neg_()  # the sign bit of the block's first element


def overwrite(kv_cache: "torch.Tensor", block_id: int) -> None:
    """Other data in every element of the block (each one's sign bit flipped)."""
    kv_cache[block_id].neg_()


class FaultSchedule:
    """Which of a connector's transfers get the fault: of those it could hit (the fault's role),
    every ``every``-th."""

    def __init__(self, fault: KVFault = NO_FAULT, every: int = 1) -> None:
        if every < 1:
            raise ValueError(f"a fault every {every} transfers: it must be at least 1")
        self.fault, self.every = fault, every
        self._chances = 0

    def hits(self, fault: KVFault) -> bool:
        """Called once per transfer that ``fault`` could hit: whether it does."""
        if fault != self.fault:
            return False
        self._chances += 1
        return self._chances % self.every == 0
