"""Transfer counters, cumulative per connector, for the metrics layer to publish."""

from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

# Why a transfer failed: its lease ran out before the pull, it timed out, the backend failed, or
# the blocks landed other than exported (``integrity``).
FailureReason = Literal["lease_expired", "timeout", "error", "checksum"]


@dataclass
class TransferStats:
    num_transfers: int = 0  # completed, both directions
    failures: Counter[str] = field(default_factory=Counter)  # failed or timed out, by reason
    bytes_moved: int = 0
    transfer_seconds: float = 0.0  # summed over completed transfers, post to done
    num_descriptors: int = 0  # one per block moved
    num_leases_expired: int = 0

    @property
    def num_failures(self) -> int:
        return self.failures.total()

    def fail(self, reason: FailureReason) -> None:
        self.failures[reason] += 1
