"""Moving KV blocks between workers: NIXL (UCX) with leases, or Ray's object store as a fallback."""

from pdserve.kvtransfer.connector import KVConnector
from pdserve.kvtransfer.factory import make_connector
from pdserve.kvtransfer.handles import (
    IncompatiblePeerError,
    KVExport,
    KVTransferError,
    PeerInfo,
    PushReceipt,
    PushTarget,
)
from pdserve.kvtransfer.layout import KVLayout
from pdserve.kvtransfer.transfer import Transfer

__all__ = [
    "IncompatiblePeerError",
    "KVConnector",
    "KVExport",
    "KVLayout",
    "KVTransferError",
    "PeerInfo",
    "PushReceipt",
    "PushTarget",
    "Transfer",
    "make_connector",
]
