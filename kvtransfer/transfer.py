"""One transfer in flight: polled, never waited on, from the engine loop or an executor."""

import time
from collections.abc import Callable

from pdserve.kvtransfer.handles import KVTransferError
from pdserve.kvtransfer.stats import TransferStats

# How long a transfer may stay in flight before it fails (``kv_transfer.timeout_seconds``).
DEFAULT_TIMEOUT_SECONDS = 10.0

# poll_fn returns True when the bytes are in place, False while in flight; raises on failure.
PollFn = Callable[[], bool]


class Transfer:
    def __init__(
        self,
        what: str,
        poll_fn: PollFn,
        timeout: float,
        stats: TransferStats,
        num_blocks: int,
        block_bytes: int,
        on_end: Callable[[bool], None] | None = None,
    ) -> None:
        self.what = what
        self._poll_fn = poll_fn
        self._stats = stats
        self._num_blocks = num_blocks
        self._block_bytes = block_bytes
        self._on_end = on_end  # called once with True on success, False on failure
        self.started = time.monotonic()
        self.deadline = self.started + timeout
        self.done = False
        self.error: KVTransferError | None = None

    @property
    def nbytes(self) -> int:
        return self._num_blocks * self._block_bytes

    def poll(self) -> bool:
        """True once the transfer is complete; raises ``KVTransferError`` if it failed."""
        if self.error is not None:
            raise self.error
        if self.done:
            return True
        try:
            if self._poll_fn():
                self._end(None)
                return True
        except KVTransferError as error:
            self._end(error, error.reason)
        except Exception as error:  # a backend's own exception type
            self._end(KVTransferError(f"{self.what}: {type(error).__name__}: {error}"), "error")
        else:
            if time.monotonic() >= self.deadline:
                timeout = self.deadline - self.started
                error = KVTransferError(f"{self.what}: timed out after {timeout:.1f} s")
                self._end(error, "timeout")
        if self.error is not None:
            raise self.error
        return False

    def wait(self, interval: float = 0.0005) -> None:
        """Polls until done; raises ``KVTransferError`` on failure or at the deadline."""
        while not self.poll():
            time.sleep(interval)

    def _end(self, error: KVTransferError | None, reason: str = "") -> None:
        self.error = error
        self.done = error is None
        if error is None:
            self._stats.num_transfers += 1
            self._stats.bytes_moved += self.nbytes
            self._stats.num_descriptors += self._num_blocks
            self._stats.transfer_seconds += time.monotonic() - self.started
        else:
            self._stats.fail(reason)
        if self._on_end is not None:
            self._on_end(error is None)
