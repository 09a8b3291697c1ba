"""What the async engine needs from a KV transfer layer, without knowing which one it is.

The engine thread drives both: a prefill-role engine hands a finished ``hold_kv`` request's blocks
to ``KVHooks.export`` and calls ``KVHooks.poll`` every loop; a decode-role request carries a
``RemoteKV`` that fills its reserved blocks and is polled until they have landed.
"""

from typing import Any, Protocol

from pdserve.engine.llm_engine import RemoteKVSlots
from pdserve.engine.outputs import PositionLogprobs


class KVHooks(Protocol):
    def export(self, request_id: str, block_ids: list[int]) -> Any:
        """Takes ownership of a finished request's blocks; returns what a peer needs to read
        them (it becomes the final output's ``kv_transfer_params``)."""
        ...

    def poll(self) -> None:
        """Bookkeeping between steps: notifications, lease expiry."""
        ...


class RemoteKV(Protocol):
    first_token: int  # sampled by the peer that computed the prompt's KV
    first_logprobs: PositionLogprobs | None  # the peer's, when the request asks for logprobs

    def start(self, slots: RemoteKVSlots) -> None:
        """Starts filling ``slots.block_ids[slots.num_cached_blocks:]``; must not block."""
        ...

    def poll(self) -> bool:
        """True once the blocks have landed; raises if the transfer failed."""
        ...

    def release(self) -> None:
        """Tells the peer its blocks are not needed after all (prefilled here instead)."""
        ...
