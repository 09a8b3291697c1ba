"""pdserve: a prefill/decode disaggregated LLM serving cluster on Ray.

The offline API mirrors vLLM's: ``pdserve.LLM`` and ``pdserve.SamplingParams``. They are imported
lazily so that light modules (config, router) do not pull in torch.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pdserve.engine.llm import LLM
    from pdserve.engine.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams"]


def __getattr__(name: str):
    if name == "LLM":
        from pdserve.engine.llm import LLM

        return LLM
    if name == "SamplingParams":
        from pdserve.engine.sampling_params import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'pdserve' has no attribute {name!r}")
