"""An ``EngineClient`` over an ``AsyncLLMEngine`` in this process: the router's API layers tested
without Ray."""

from collections.abc import AsyncIterator

from pdserve.engine.async_engine import AsyncLLMEngine
from pdserve.engine.config import EngineConfig
from pdserve.engine.generation_config import load_generation_defaults
from pdserve.engine.outputs import RequestOutput
from pdserve.engine.sampling_params import SamplingParams
from pdserve.router.timing import mark_upstream_call, mark_upstream_output


class LocalEngineClient:
    def __init__(self, engine: AsyncLLMEngine, model_name: str) -> None:
        self.engine = engine
        self.model_name = model_name
        self.max_model_len = engine.engine.max_model_len
        self.tokenizer = engine.engine.tokenizer
        self.generation_defaults = load_generation_defaults(engine.engine.config)

    @classmethod
    def from_config(cls, config: EngineConfig, model_name: str) -> "LocalEngineClient":
        return cls(AsyncLLMEngine(config), model_name)

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        priority: int = 0,
    ) -> AsyncIterator[RequestOutput]:
        mark_upstream_call()
        async for chunk in self.engine.generate(request_id, prompt_token_ids, params, priority):
            mark_upstream_output(chunk)
            yield chunk

    async def check_health(self) -> None:
        self.engine.check_health()

    def shutdown(self) -> None:
        self.engine.shutdown()
