"""The plain data the router and the two worker pools pass each other through Serve handles."""

from dataclasses import dataclass, field

from pdserve.engine.outputs import RequestOutput
from pdserve.engine.sampling_params import SamplingParams
from pdserve.kvtransfer.handles import KVExport, PeerInfo


@dataclass(frozen=True)
class GenerateRequest:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    priority: int = 0
    # The prompt's prefix-cache hash chain (the engines' own), for KV-aware routing.
    block_hashes: tuple[bytes, ...] = ()
    # Where the ingress placed it: pool role ("prefill", "decode") -> Serve replica id.
    replicas: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PrefillResult:
    """A remote prefill's outcome: its one-token output and, if decoding goes on, the KV handle.

    ``kv`` is None when the request ended at its first token (EOS, a stop, or max_tokens 1):
    nothing is held and there is nothing to decode.
    """

    first_output: RequestOutput
    owner: PeerInfo
    kv: KVExport | None


@dataclass(frozen=True)
class RemotePrefilled:
    """What a decode replica needs to continue a request that a prefill replica began."""

    request: GenerateRequest
    prefill: PrefillResult
