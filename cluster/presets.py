"""Sizes of the built-in Llama models that ``pdserve make-model`` writes: the architecture fields
of their ``config.json``, read back through the engine's own ``ModelConfig``."""

from typing import Any

from pdserve.engine.config import ModelConfig

PRESETS: dict[str, dict[str, Any]] = {
    # Fast enough for unit tests on a laptop CPU; tied like Qwen2-0.5B, so a tied head is exercised.
    "tiny": {
        "vocab_size": 4096,  # the BPE tokenizer is trained to exactly this many ids
        "hidden_size": 256,
        "intermediate_size": 768,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": True,
    },
    # GPT-2-small scale (~125M) with Llama's untied head, for benchmarks that need real matmul work.
    "small": {
        "vocab_size": 32000,
        "hidden_size": 768,
        "intermediate_size": 2048,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "num_key_value_heads": 4,
        "head_dim": 64,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
    },
}


def preset_config(name: str) -> ModelConfig:
    """The preset's architecture; raises ValueError for an unknown name."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}")
    return ModelConfig.from_dict({"model_type": "llama", **PRESETS[name]})
