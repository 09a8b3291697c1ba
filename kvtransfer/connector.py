"""A worker's end of KV transfer: the part every backend shares.

An owner (prefill role) ``export``s finished blocks under a lease and calls ``poll`` from its loop,
which frees blocks whose reader said it is done or whose lease ran out. A reader (decode role)
``add_peer``s the owner's ``PeerInfo`` once, then ``pull``s an export into its own block ids.
Every transfer is a ``Transfer`` to poll; no call blocks for long (NIXL copies a chunk per poll).
A pull is done only once what landed matches the owner's checksums at export (``integrity``).
A connector is not thread-safe: call it from one thread.

Pull is the only direction (issue 16 kept one of push and pull): the first token reaches the
client when the prefill returns, so the pull is off the TTFT path; both moved KV at the same rate
over UCX's cma; and a push needs the decode replica chosen, its blocks reserved, before the
prefill starts.
"""

import collections
import logging
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable

import torch

from pdserve.kvtransfer import faults
from pdserve.kvtransfer.faults import NO_FAULT, FaultSchedule, KVFault
from pdserve.kvtransfer.handles import (
    IncompatiblePeerError,
    KVExport,
    KVTransferError,
    PeerInfo,
)
from pdserve.kvtransfer.integrity import block_checksums, check_checksums
from pdserve.kvtransfer.layout import KVLayout
from pdserve.kvtransfer.leases import DEFAULT_LEASE_SECONDS, LeaseTable
from pdserve.kvtransfer.stats import TransferStats
from pdserve.kvtransfer.transfer import DEFAULT_TIMEOUT_SECONDS, PollFn, Transfer

logger = logging.getLogger(__name__)

# A pull must be able to finish this long before the owner's lease ends, or it is not started.
LEASE_MARGIN_SECONDS = 1.0


class KVConnector(ABC):
    backend: str

    def __init__(
        self,
        kv_cache: torch.Tensor,
        layout: KVLayout,
        free_blocks: Callable[[list[int]], None],
        name: str | None = None,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        verify: bool = True,
        fault_injection: KVFault = NO_FAULT,
        fault_every: int = 1,
    ) -> None:
        """``verify``: checksum each exported block, and check what lands (``integrity``).
        ``fault_injection``, on one in ``fault_every`` transfers: test-only (``faults``)."""
        layout.check_cache(kv_cache)
        self.kv_cache = kv_cache
        self.layout = layout
        self.name = name or f"pdserve-{uuid.uuid4().hex[:12]}"
        self.num_blocks = kv_cache.shape[0]
        self.block_bytes = kv_cache[0].numel() * kv_cache.element_size()
        self.lease_seconds = lease_seconds
        self.timeout = timeout
        self.verify = verify
        self.faults = FaultSchedule(fault_injection, fault_every)
        self.stats = TransferStats()
        self._free_blocks = free_blocks
        self._leases = LeaseTable(free_blocks, self.name)
        # Leases whose reader will not come, ended at the next poll (deque: any thread appends).
        self._dropped: collections.deque[str] = collections.deque()
        self._peers: dict[str, PeerInfo] = {}

    # -- both roles --------------------------------------------------------------------------

    @abstractmethod
    def peer_info(self) -> PeerInfo:
        """This connector as peers need it; send it to them once."""

    def add_peer(self, info: PeerInfo) -> None:
        """Checks and connects a peer once; later calls with the same name are free."""
        if info.name in self._peers:
            return
        if info.backend != self.backend:
            raise IncompatiblePeerError(
                f"peer {info.name} moves KV over {info.backend!r}, "
                f"this worker over {self.backend!r}"
            )
        differences = self.layout.differences(info.layout)
        if differences:
            raise IncompatiblePeerError(
                f"peer {info.name} has an incompatible KV cache (ours != theirs): "
                + "; ".join(differences)
            )
        self._connect(info)
        self._peers[info.name] = info

    def poll(self) -> None:
        """Owner bookkeeping, from the worker's loop: frees blocks of finished, dropped or expired
        leases."""
        self._handle_notifications()
        while self._dropped:
            self._leases.release(self._dropped.popleft())
        self.stats.num_leases_expired += len(self._leases.expire())

    @property
    def num_pinned_blocks(self) -> int:
        return self._leases.num_pinned_blocks

    def close(self) -> None:
        """Frees every block still under a lease."""
        self._leases.release_all()

    # -- owner ------------------------------------------------------------------------------

    def export(self, block_ids: list[int]) -> KVExport:
        """Makes blocks readable by a peer until the lease ends; they stay pinned till then."""
        checksums = self._checksums(block_ids)
        lease_id = self._leases.grant(block_ids, self.lease_seconds)
        self._inject_reuse(block_ids)
        if self.faults.hits("free_early"):
            self._leases.release(lease_id)
        return KVExport(
            self.name, tuple(block_ids), lease_id, self.lease_seconds, checksums=checksums
        )

    def drop_lease(self, lease_id: str) -> None:
        """From any thread: the export's reader will not come (the request ended before a decode
        replica took it), so its blocks are freed at the next ``poll``, not at the expiry. A
        reader still pulling reads blocks that may be reused meanwhile: only an aborted request's,
        which it frees without caching them."""
        self._dropped.append(lease_id)

    # -- reader -----------------------------------------------------------------------------

    def pull(self, export: KVExport, block_ids: list[int], skip: int = 0) -> Transfer:
        """Reads an owner's exported blocks, but the first ``skip`` (cached here), into ours.

        The owner is told when they are in, which ends its lease.
        """
        if export.owner not in self._peers:
            raise KVTransferError(f"unknown peer {export.owner}: add_peer its PeerInfo first")
        self._check_lengths(len(export.block_ids) - skip, len(block_ids))
        time_left = export.time_left() - LEASE_MARGIN_SECONDS
        if time_left <= 0:
            self.stats.fail("lease_expired")
            raise KVTransferError(f"the lease on {export.owner}'s blocks has run out")
        if not block_ids:  # every block is cached here: nothing to read
            self.release(export)
            return self._transfer(f"pull of no blocks from {export.owner}", lambda: True, 0)
        return self._start_pull(export, skip, block_ids, min(self.timeout, time_left))

    @abstractmethod
    def release(self, export: KVExport) -> None:
        """Tells the owner its exported blocks are no longer needed (without reading them)."""

    # -- backends ---------------------------------------------------------------------------

    @abstractmethod
    def _connect(self, info: PeerInfo) -> None: ...

    def _checksums(self, block_ids: list[int]) -> tuple[int, ...]:
        return block_checksums(self.kv_cache, block_ids) if self.verify else ()

    def _inject_reuse(self, block_ids: list[int]) -> None:
        if self.faults.hits("reuse"):
            faults.overwrite(self.kv_cache, block_ids[0])

    def _checked(
        self, what: str, landed: PollFn, export: KVExport, skip: int, block_ids: list[int]
    ) -> PollFn:
        """A pull's poll function that, once the blocks have landed, checks them against their
        checksums at export (raising ``KVIntegrityError``) before anything reads them."""

        corrupt = self.faults.hits("corrupt")

        def poll() -> bool:
            if not landed():
                return False
            if corrupt:
                faults.flip_a_bit(self.kv_cache, block_ids[0])
            if self.verify and export.checksums:
                check_checksums(what, self.kv_cache, block_ids, export.checksums[skip:])
            return True

        return poll

    @abstractmethod
    def _start_pull(
        self, export: KVExport, skip: int, block_ids: list[int], timeout: float
    ) -> Transfer: ...

    @abstractmethod
    def _handle_notifications(self) -> None:
        """Acts on what peers told the owner: blocks read (release their lease)."""

    def _transfer(
        self,
        what: str,
        poll_fn: Callable[[], bool],
        num_blocks: int,
        timeout: float | None = None,
        on_end: Callable[[bool], None] | None = None,
    ) -> Transfer:
        return Transfer(
            what,
            poll_fn,
            self.timeout if timeout is None else timeout,
            self.stats,
            num_blocks,
            self.block_bytes,
            on_end,
        )

    @staticmethod
    def _check_lengths(num_src: int, num_dst: int) -> None:
        if num_src != num_dst:
            raise KVTransferError(f"{num_src} source blocks for {num_dst} destination blocks")
