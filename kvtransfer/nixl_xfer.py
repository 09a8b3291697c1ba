"""One NIXL READ, posted a chunk of blocks at a time so that no call holds its caller long.

Over UCX's cma (host memory between processes) a post does the whole copy in the caller's thread:
posted at once, a long prompt's blocks would hold a decode loop for the whole copy. So each ``poll``
posts chunks until it has spent ``post_budget`` seconds (at least one chunk); an engine loop that
polls between steps interleaves the copy with them. Where posts return at once (GPU memory, RDMA)
every chunk goes out in the first poll. The notification rides on the last chunk only, posted once
the others have landed, so the owner hears of the read after all its bytes are in place. A
``last`` chunk, when given, goes after the blocks' (a checked pull reads the owner's block
generations there, after the blocks, and so tells the owner only then).
"""

import logging
import time
from collections import deque
from typing import Any

from pdserve.kvtransfer import nixl_shim
from pdserve.kvtransfer.handles import KVTransferError

logger = logging.getLogger(__name__)


class ChunkedXfer:
    def __init__(
        self,
        what: str,
        agent: Any,
        local: Any,
        local_ids: list[int],
        remote: Any,
        remote_ids: list[int],
        notification: bytes,
        chunk_blocks: int,
        post_budget: float,
        last: tuple[list[int], list[int]] | None = None,
    ) -> None:
        self._what = what
        self._agent = agent
        self._local = local
        self._remote = remote
        self._notification = notification
        self._post_budget = post_budget
        # (our descriptor indices, the peer's), in order; the last carries the notification.
        self._chunks = deque(
            (local_ids[i : i + chunk_blocks], remote_ids[i : i + chunk_blocks])
            for i in range(0, len(local_ids), chunk_blocks)
        )
        if last is not None:
            self._chunks.append(last)
        self._in_flight: list[Any] = []  # posted handles not yet seen done

    def poll(self) -> bool:
        """Posts what the budget allows; True once every chunk has landed, raises on an error."""
        self._reap()
        start = time.monotonic()
        while self._chunks and not (len(self._chunks) == 1 and self._in_flight):
            self._post(*self._chunks.popleft())
            self._reap()
            if time.monotonic() - start >= self._post_budget:
                break
        return not self._chunks and not self._in_flight

    def release(self) -> None:
        """Releases every handle still in flight; NIXL cancels them (a failed or late transfer)."""
        for handle in self._in_flight:
            try:
                handle.release()
            except Exception:
                # Not cancellable now: the handle stays with the agent, which frees it at teardown.
                logger.warning("%s: could not release a NIXL transfer handle", self._what)
        self._in_flight.clear()

    def _post(self, local_ids: list[int], remote_ids: list[int]) -> None:
        notification = b"" if self._chunks else self._notification
        with nixl_shim.explained(self._what):
            handle = self._agent.make_prepped_xfer(
                "READ", self._local, local_ids, self._remote, remote_ids, notification
            )
            self._in_flight.append(handle)
            state = self._agent.transfer(handle)
        if state == "ERR":
            raise KVTransferError(f"{self._what}: {nixl_shim.TRANSFER_FAILED}")

    def _reap(self) -> None:
        for handle in list(self._in_flight):
            with nixl_shim.explained(self._what):
                state = self._agent.check_xfer_state(handle)
            if state == "ERR":
                raise KVTransferError(f"{self._what}: {nixl_shim.TRANSFER_FAILED}")
            if state == "DONE":
                handle.release()
                self._in_flight.remove(handle)
