"""Transfer counters, cumulative per connector, for the metrics layer to publish."""

from dataclasses import dataclass


@dataclass
class TransferStats:
    num_transfers: int = 0  # completed, both directions
    num_failures: int = 0  # failed or timed out
    bytes_moved: int = 0
    transfer_seconds: float = 0.0  # summed over completed transfers, post to done
    num_descriptors: int = 0  # one per block moved
    num_leases_expired: int = 0
