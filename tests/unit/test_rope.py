"""Our RoPE frequencies equal transformers' for each supported scaling type."""

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from pdserve.engine.config import ModelConfig
from pdserve.engine.rope import inverse_frequencies

SCALINGS = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 1024,
    },
}


@pytest.mark.parametrize("kind", SCALINGS)
def test_inverse_frequencies_match_transformers(kind: str) -> None:
    hf_config = LlamaConfig(
        hidden_size=512,
        num_attention_heads=4,
        max_position_embeddings=4096,
        rope_theta=500000.0,
        rope_scaling=SCALINGS[kind],
    )
    ours = ModelConfig.from_dict(hf_config.to_dict())
    assert ours.rope_scaling.rope_type == kind
    expected = (
        ROPE_INIT_FUNCTIONS[kind](hf_config, "cpu")[0]
        if kind != "default"
        else 1.0 / (500000.0 ** (torch.arange(0, 128, 2).float() / 128))
    )
    got = inverse_frequencies(ours.head_dim, ours.rope_theta, ours.rope_scaling)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
