"""What the API layers (HTTP, gRPC) need from an engine.

The interface carries plain data only (token ids, ``SamplingParams``, ``RequestOutput``), so a
client that reaches the engine through a Ray Serve handle implements it the same way as the
in-process one the tests use (``tests/e2e/local_client.py``). This module imports no torch: the
router process stays light.
"""

from collections.abc import AsyncIterator, Mapping
from typing import Protocol

from pdserve.engine.generation_config import GenerationDefaults
from pdserve.engine.outputs import RequestOutput
from pdserve.engine.sampling_params import SamplingParams
from pdserve.engine.tokenizer import Tokenizer
from pdserve.router.api.errors import model_not_found


class EngineClient(Protocol):
    """One served model. ``generate`` takes n == 1 params (callers fan out n themselves)."""

    model_name: str
    max_model_len: int
    tokenizer: Tokenizer
    generation_defaults: GenerationDefaults  # for the sampling fields a request leaves out

    def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        priority: int = 0,
    ) -> AsyncIterator[RequestOutput]:
        """Streams delta chunks; the last one is finished. Refusals (``RequestError``,
        ``EngineOverloadedError``, ``EngineStoppedError``) raise before the first chunk.
        Closing the iterator early aborts the request and frees its KV blocks."""
        ...

    async def check_health(self) -> None:
        """Returns when the engine can serve; raises ``EngineStoppedError`` when it cannot."""
        ...


def pick_client(clients: Mapping[str, EngineClient], model: str | None) -> EngineClient:
    """The client serving ``model``; no model (None or "") means the first one, as in vLLM."""
    name = model or next(iter(clients))
    if name not in clients:
        raise model_not_found(name)
    return clients[name]


async def check_all(clients: Mapping[str, EngineClient]) -> None:
    """Raises ``EngineStoppedError`` unless every model can serve."""
    for client in clients.values():
        await client.check_health()
