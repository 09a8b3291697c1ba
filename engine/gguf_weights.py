"""A GGUF file's tensors as an HF checkpoint holds them: dequantized to float32 by gguf, named as
transformers names them, with llama.cpp's reordering of q and k rows undone."""

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from gguf import GGUFReader
from gguf.quants import dequantize

from pdserve.engine.config import ModelConfig, RopeScaling
from pdserve.engine.errors import CheckpointError
from pdserve.engine.gguf_checkpoint import ROPE_FREQS
from pdserve.engine.rope import inverse_frequencies

# GGUF tensor names (less ".weight"/".bias") -> HF's; those of layer N are "blk.N.<name>".
MODEL_TENSORS = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
LAYER_TENSORS = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
# llama.cpp's converter reorders the rows of q and k (weights and biases) for its own rotary
# layout (convert_hf_to_gguf's `permute`) for these architectures; not for qwen2.
PERMUTED_ARCHITECTURES = ("llama", "mistral")
# How far the file's Llama 3 rope divisors may be from those the config's parameters give.
ROPE_FREQS_RTOL = 1e-3


def hf_tensors(
    path: Path, reader: GGUFReader, config: ModelConfig
) -> Iterator[tuple[str, torch.Tensor, int]]:
    """(HF name, float32 tensor in HF's layout, bytes in the file) for every weight of the file."""
    for tensor in reader.tensors:
        # The reader gives numpy's dims (GGUF stores them reversed): [rows, bytes per row] for a
        # quantized tensor, which dequantizes to [rows, columns] = HF's [out, in].
        weights = dequantize(tensor.data, tensor.tensor_type)
        if tensor.name == ROPE_FREQS:  # the config's rope scaling, not a weight
            _check_rope_freqs(path, weights, config)
            continue
        name = hf_name(path, tensor.name)
        if config.model_type in PERMUTED_ARCHITECTURES:
            if name.endswith((".q_proj.weight", ".q_proj.bias")):
                weights = _unpermute(weights, config.num_attention_heads)
            elif name.endswith((".k_proj.weight", ".k_proj.bias")):
                weights = _unpermute(weights, config.num_key_value_heads)
        # A copy where the data is still the read-only map (F32), so torch gets its own memory.
        weights = np.require(weights, np.float32, ["C_CONTIGUOUS", "WRITEABLE"])
        yield name, torch.from_numpy(weights), tensor.n_bytes


def hf_name(path: Path, gguf_name: str) -> str:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``."""
    *stem, suffix = gguf_name.split(".")
    if len(stem) == 1 and stem[0] in MODEL_TENSORS:
        return f"{MODEL_TENSORS[stem[0]]}.{suffix}"
    if len(stem) == 3 and stem[0] == "blk" and stem[1].isdigit() and stem[2] in LAYER_TENSORS:
        return f"model.layers.{stem[1]}.{LAYER_TENSORS[stem[2]]}.{suffix}"
    raise CheckpointError(f"{path}: unexpected tensor {gguf_name!r} for a Llama-family model")


def _unpermute(weights: np.ndarray, num_heads: int) -> np.ndarray:
    # llama.cpp wrote each head's rows [half, i] as [i, half] (interleaved rotary pairs); swap back.
    pairs = weights.shape[0] // num_heads // 2
    heads = weights.reshape(num_heads, pairs, 2, *weights.shape[1:])
    return heads.swapaxes(1, 2).reshape(weights.shape)


def _check_rope_freqs(path: Path, divisors: np.ndarray, config: ModelConfig) -> None:
    plain = inverse_frequencies(config.head_dim, config.rope_theta, RopeScaling())
    scaled = inverse_frequencies(config.head_dim, config.rope_theta, config.rope_scaling)
    if not np.allclose((plain / scaled).numpy(), divisors, rtol=ROPE_FREQS_RTOL):
        raise CheckpointError(
            f"{path}: its {ROPE_FREQS} are not Llama 3's rope scaling with "
            f"factor {config.rope_scaling.factor:g} and its usual parameters, which pdserve "
            "cannot load"
        )
