"""A connector seen from the engine thread: the engine's ``KVHooks`` and ``RemoteKV`` over it."""

from pdserve.engine.llm_engine import RemoteKVSlots
from pdserve.engine.outputs import PositionLogprobs
from pdserve.kvtransfer.connector import KVConnector
from pdserve.kvtransfer.handles import KVExport, PeerInfo
from pdserve.kvtransfer.transfer import Transfer


class ConnectorHooks:
    """Prefill role: a finished request's blocks are exported under a lease."""

    def __init__(self, connector: KVConnector) -> None:
        self.connector = connector

    def export(self, request_id: str, block_ids: list[int]) -> KVExport:
        return self.connector.export(block_ids)

    def poll(self) -> None:
        self.connector.poll()


class PeerPull:
    """Decode role: pulls a peer's exported prompt blocks into the request's reserved ones."""

    def __init__(
        self,
        connector: KVConnector,
        owner: PeerInfo,
        export: KVExport,
        first_token: int,
        first_logprobs: PositionLogprobs | None = None,
    ) -> None:
        self.connector = connector
        self.owner = owner
        self.export = export
        self.first_token = first_token
        self.first_logprobs = first_logprobs
        self._transfer: Transfer | None = None

    def start(self, slots: RemoteKVSlots) -> None:
        self.connector.add_peer(self.owner)
        skip = slots.num_cached_blocks
        self._transfer = self.connector.pull(self.export, slots.block_ids[skip:], skip)

    def poll(self) -> bool:
        return self._transfer.poll()

    def release(self) -> None:
        # A pull that never started (no blocks free here) has not connected to the owner yet.
        self.connector.add_peer(self.owner)
        self.connector.release(self.export)
