"""The offline API, shaped like vLLM's: ``LLM(model=DIR).generate(prompts, SamplingParams())``."""

import itertools
from collections.abc import Sequence

from pdserve.engine.config import EngineConfig
from pdserve.engine.llm_engine import LLMEngine
from pdserve.engine.outputs import CompletionOutput, RequestOutput
from pdserve.engine.sampling_params import SamplingParams, fan_out
from pdserve.engine.tokenizer import Tokenizer

Prompt = str | list[int]


class LLM:
    def __init__(self, model: str, **engine_args) -> None:
        self.engine = LLMEngine(EngineConfig(model=str(model), **engine_args))
        self._ids = itertools.count()

    def get_tokenizer(self) -> Tokenizer:
        return self.engine.tokenizer

    def reset_prefix_cache(self) -> bool:
        """Empties the prefix cache, as vLLM's ``LLM.reset_prefix_cache``; False while busy."""
        return self.engine.reset_prefix_cache()

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Generates for all prompts (text or token ids) at once; outputs keep their order."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError(
                f"got {len(sampling_params)} sampling params for {len(prompts)} prompts"
            )
        results: dict[str, RequestOutput] = {}
        children: dict[str, tuple[str, int]] = {}  # child id -> (parent id, completion index)
        try:
            for prompt, params in zip(prompts, sampling_params, strict=True):
                parent_id = str(next(self._ids))
                for index, child_params in enumerate(fan_out(params)):
                    child_id = f"{parent_id}-{index}"
                    request = self.engine.add_request(child_id, prompt, child_params)
                    children[child_id] = (parent_id, index)
                    results.setdefault(
                        parent_id,
                        RequestOutput(
                            parent_id,
                            request.prompt,
                            request.prompt_token_ids,
                            [CompletionOutput(i) for i in range(params.n)],
                        ),
                    )
            while self.engine.has_unfinished_requests():
                for delta in self.engine.step():
                    parent_id, index = children[delta.request_id]
                    delta.outputs[0].index = index  # each child is the engine's completion 0
                    results[parent_id].add(delta)
        except BaseException:
            for child_id in children:
                self.engine.abort_request(child_id)
            raise
        return list(results.values())
