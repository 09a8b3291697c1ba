"""A GGUF checkpoint of the Llama family: the file opened with one-line errors, its metadata, and
the model config it describes (llama.cpp's metadata keys read into an HF ``config.json``'s
fields). Needs no torch: the router reads configs too."""

import re
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, Keys
from gguf.quants import dequantize

from pdserve.engine.config import ModelConfig
from pdserve.engine.errors import CheckpointError

Q = GGMLQuantizationType
SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "mistral")  # `general.architecture`
# The types pdserve dequantizes at load, each pinned by a test against gguf's own dequantization.
SUPPORTED_TENSOR_TYPES = (
    Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q5_K, Q.Q6_K,
)  # fmt: skip
SUPPORTED_ROPE_SCALING = {"none": "default", "linear": "linear"}  # `rope.scaling.type` -> HF's
# llama.cpp writes Llama 3's rope scaling as a tensor of per-frequency divisors, not as metadata;
# these are the parameters of every Llama 3.x that has it, checked against the tensor at load.
ROPE_FREQS = "rope_freqs.weight"
LLAMA3_ROPE = {
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
OUTPUT_WEIGHT = "output.weight"  # absent when the head is tied to the embeddings
EMBEDDING_WEIGHT = "token_embd.weight"
QKV_BIAS = "blk.0.attn_q.bias"


def open_gguf(path: Path) -> GGUFReader:
    """Reads the header, metadata and tensor table (the tensor data stays mapped, unread); a file
    that is not a GGUF, is cut short, or holds a tensor type pdserve does not load is a
    ``CheckpointError``."""
    stat = path.stat()
    return _open(path.resolve(), stat.st_mtime_ns, stat.st_size)


class _Reader(GGUFReader):
    """gguf's reader over a plain array view of the file's map. gguf slices its ``np.memmap`` once
    per metadata element, and the memmap's bookkeeping on every slice made SmolLM2's 49k-token
    vocabulary 3.5 s to parse, in every process that opens the file; 1.3 s through the view
    (docs/benchmarks.md). The tensors stay views of the map, read only when dequantized."""

    @property
    def data(self) -> np.ndarray:
        return self._mapped

    @data.setter
    def data(self, mapped: np.memmap) -> None:
        self._mapped = mapped.view(np.ndarray)


# One load reads the same file three times (config, tokenizer, weights): the last file read is
# kept, keyed by its time and size so that a file written anew is read anew.
@lru_cache(maxsize=1)
def _open(path: Path, mtime_ns: int, size: int) -> GGUFReader:
    try:
        reader = _Reader(path)
    except (ValueError, IndexError, KeyError, OverflowError) as error:
        # gguf reads types through its enum, whose error reads "<n> is not a valid <enum>".
        unknown = re.search(rf"(\d+)\)? is not a valid {Q.__name__}", str(error))
        if type(error) is ValueError and unknown:
            raise CheckpointError(
                f"{path} holds a tensor of unknown GGUF type {unknown[1]} "
                f"(pdserve loads {_supported_types()})"
            ) from None
        raise CheckpointError(f"{path} is truncated or not a GGUF file ({error})") from None
    if metadata(reader, Keys.Split.LLM_KV_SPLIT_COUNT, 1) > 1:
        raise CheckpointError(
            f"{path} is one part of a split GGUF: merge the parts into one file first "
            "(llama.cpp's llama-gguf-split --merge)"
        )
    for tensor in reader.tensors:
        if tensor.tensor_type not in SUPPORTED_TENSOR_TYPES:
            raise CheckpointError(
                f"{path}: tensor {tensor.name} is of type {tensor.tensor_type.name}, which pdserve "
                f"does not load (it loads {_supported_types()})"
            )
    return reader


def _supported_types() -> str:
    return ", ".join(t.name for t in SUPPORTED_TENSOR_TYPES)


def metadata(reader: GGUFReader, key: str, default: Any = None) -> Any:
    """The value of a metadata key (a list for arrays), or ``default`` when the file lacks it."""
    field = reader.get_field(key)
    return default if field is None else field.contents()


def architecture(path: Path, reader: GGUFReader) -> str:
    arch = metadata(reader, Keys.General.ARCHITECTURE)
    if arch not in SUPPORTED_ARCHITECTURES:
        raise CheckpointError(
            f"{path}: GGUF architecture {arch!r} is not supported "
            f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    return arch


def gguf_model_config(path: Path) -> ModelConfig:
    """The model config of the GGUF file ``path``."""
    return model_config(path, open_gguf(path))


def model_config(path: Path, reader: GGUFReader) -> ModelConfig:
    arch = architecture(path, reader)

    def key(template: str, default: Any = None) -> Any:
        value = metadata(reader, template.format(arch=arch), default)
        if value is None:
            raise CheckpointError(f"{path}: GGUF metadata lacks {template.format(arch=arch)}")
        return value

    tensors = {t.name: t for t in reader.tensors}
    if EMBEDDING_WEIGHT not in tensors:
        raise CheckpointError(f"{path}: GGUF file has no {EMBEDDING_WEIGHT}")
    num_heads = key(Keys.Attention.HEAD_COUNT)
    head_dim = metadata(reader, Keys.Attention.KEY_LENGTH.format(arch=arch))
    head_dim = head_dim or key(Keys.LLM.EMBEDDING_LENGTH) // num_heads
    rotary_dims = metadata(reader, Keys.Rope.DIMENSION_COUNT.format(arch=arch), head_dim)
    if rotary_dims != head_dim:
        raise CheckpointError(
            f"{path}: rotary embeddings over {rotary_dims} of {head_dim} head dimensions "
            "are not supported"
        )
    raw = {
        "model_type": arch,
        # The embedding's rows, not the token list: the weights decide what the model computes.
        "vocab_size": int(tensors[EMBEDDING_WEIGHT].data.shape[0]),
        "hidden_size": key(Keys.LLM.EMBEDDING_LENGTH),
        "intermediate_size": key(Keys.LLM.FEED_FORWARD_LENGTH),
        "num_hidden_layers": key(Keys.LLM.BLOCK_COUNT),
        "num_attention_heads": num_heads,
        "num_key_value_heads": key(Keys.Attention.HEAD_COUNT_KV, num_heads),
        "head_dim": head_dim,
        "max_position_embeddings": key(Keys.LLM.CONTEXT_LENGTH),
        "rms_norm_eps": key(Keys.Attention.LAYERNORM_RMS_EPS),
        "rope_theta": key(Keys.Rope.FREQ_BASE, 10000.0),
        "rope_scaling": _rope_scaling(path, reader, arch, tensors),
        "tie_word_embeddings": OUTPUT_WEIGHT not in tensors,
        "attention_bias": QKV_BIAS in tensors,
        "sliding_window": metadata(reader, Keys.Attention.SLIDING_WINDOW.format(arch=arch)),
        "bos_token_id": metadata(reader, Keys.Tokenizer.BOS_ID),
        "eos_token_id": metadata(reader, Keys.Tokenizer.EOS_ID),
    }
    try:
        return ModelConfig.from_dict(raw)
    except ValueError as error:
        raise CheckpointError(f"{path}: {error}") from None


def _rope_scaling(
    path: Path, reader: GGUFReader, arch: str, tensors: dict[str, Any]
) -> dict[str, Any] | None:
    if ROPE_FREQS in tensors:
        factors = dequantize(tensors[ROPE_FREQS].data, tensors[ROPE_FREQS].tensor_type)
        # The lowest frequencies are slowed by the whole factor, the highest not at all.
        return {"rope_type": "llama3", "factor": float(factors.max()), **LLAMA3_ROPE}
    kind = metadata(reader, Keys.Rope.SCALING_TYPE.format(arch=arch), "none")
    if kind not in SUPPORTED_ROPE_SCALING:
        raise CheckpointError(
            f"{path}: rope scaling {kind!r} is not supported "
            f"(supported: {', '.join(SUPPORTED_ROPE_SCALING)})"
        )
    if kind == "none":
        return None
    factor = metadata(reader, Keys.Rope.SCALING_FACTOR.format(arch=arch), 1.0)
    return {"rope_type": SUPPORTED_ROPE_SCALING[kind], "factor": factor}
