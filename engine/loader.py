"""Build the model from a checkpoint: an HF directory (``model.safetensors`` or a sharded index)
or a GGUF file (``engine/checkpoint_format.py``)."""

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from tqdm import tqdm

from pdserve.engine.checkpoint_format import gguf_file
from pdserve.engine.config import ModelConfig
from pdserve.engine.linear import (
    choose_q8_dequantize_rows,
    onednn_packing_helps,
    quantized_linears,
)
from pdserve.engine.model import LlamaForCausalLM
from pdserve.kernels import native

logger = logging.getLogger(__name__)

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# Checkpoints above this size get a progress bar while loading.
PROGRESS_MIN_BYTES = 1 << 30
# HF names of separate projections -> (our fused parameter, shard index); see model.py.
FUSED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


def checkpoint_files(path: Path) -> list[Path]:
    if (path / INDEX_FILE).is_file():
        index = json.loads((path / INDEX_FILE).read_text())
        return [path / name for name in sorted(set(index["weight_map"].values()))]
    if (path / SINGLE_FILE).is_file():
        return [path / SINGLE_FILE]
    raise FileNotFoundError(f"no {SINGLE_FILE} or {INDEX_FILE} in {path}")


def load_model(
    path: str | Path,
    config: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
    quantization: str | None = None,
) -> LlamaForCausalLM:
    """Builds the model without initialising weights, then copies every tensor from the files;
    quantizes the linear weights (``quantization``: "int8" or None), packs those left in fp32
    for oneDNN where that is faster (see ``onednn_packing_helps``), and has the native few-row
    products read them the way this CPU reads them faster (``native.choose_f32_row_reads``), the
    int8 ones of many rows dequantize where that is faster (``choose_q8_dequantize_rows``)."""
    path = Path(path)
    total_bytes, tensors = _checkpoint_tensors(path, config)
    # Built on the device from uninitialised tensors (no module here initialises at random), not on
    # "meta": materialising meta tensors imports torch's symbolic-shape machinery, seconds of a
    # replica's start.
    with torch.device(device):
        model = LlamaForCausalLM(config, dtype, device).to(dtype)
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    with tqdm(
        total=total_bytes,
        unit="B",
        unit_scale=True,
        desc=f"loading {path.name}",
        disable=total_bytes < PROGRESS_MIN_BYTES,
    ) as bar:
        for name, tensor, num_bytes in tensors:
            target = _copy_into(params, name, tensor, config)
            if target is not None:
                loaded.add(target)
            bar.update(num_bytes)
    missing = _expected_pieces(params, config) - loaded
    if missing:
        raise ValueError(f"checkpoint {path} lacks weights: {', '.join(sorted(missing))}")
    if quantization is not None:
        left = model.quantize_linear_weights()
        if left:
            logger.warning("left in %s (rows not of whole Q8_0 blocks): %s", dtype, ", ".join(left))
    if onednn_packing_helps(dtype, device):
        model.pack_linear_weights()
    fp32_weights = model.fp32_linear_weights()
    if fp32_weights and device.type == "cpu" and native.available():
        native.choose_f32_row_reads(fp32_weights)
    quantized = quantized_linears(model)
    if quantized and device.type == "cpu" and native.available():
        rows = choose_q8_dequantize_rows(quantized_linears(model.model.layers[0]))
        for linear in quantized:
            linear.dequantize_from_rows = rows
    return model.eval()


def _checkpoint_tensors(
    path: Path, config: ModelConfig
) -> tuple[int, Iterator[tuple[str, torch.Tensor, int]]]:
    """The checkpoint's size in bytes, and its (HF name, tensor, bytes read) one by one."""
    gguf = gguf_file(path)
    if gguf is not None:
        # Imported here: only a GGUF checkpoint needs the gguf package.
        from pdserve.engine.gguf_checkpoint import open_gguf
        from pdserve.engine.gguf_weights import hf_tensors

        return gguf.stat().st_size, hf_tensors(gguf, open_gguf(gguf), config)
    files = checkpoint_files(path)
    return sum(f.stat().st_size for f in files), _safetensors_tensors(files)


def _safetensors_tensors(files: list[Path]) -> Iterator[tuple[str, torch.Tensor, int]]:
    for file in files:
        with safe_open(file, framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                tensor = f.get_tensor(name)
                yield name, tensor, tensor.numel() * tensor.element_size()


def _copy_into(
    params: dict[str, torch.nn.Parameter], name: str, tensor: torch.Tensor, config: ModelConfig
) -> str | None:
    """Copies one checkpoint tensor into its (maybe fused) parameter; returns the piece filled."""
    if "rotary_emb" in name or (name == "lm_head.weight" and config.tie_word_embeddings):
        return None
    parts = name.split(".")
    fused = FUSED.get(parts[-2]) if len(parts) >= 2 else None
    if fused is None:
        if name not in params:
            raise ValueError(f"unexpected weight {name!r} in checkpoint")
        _checked_copy(params[name], tensor, name)
        return name
    fused_name, shard = fused
    target = ".".join([*parts[:-2], fused_name, parts[-1]])
    param = params[target]
    sizes = _shard_sizes(fused_name, config)
    start = sum(sizes[:shard])
    _checked_copy(param.data.narrow(0, start, sizes[shard]), tensor, name)
    return f"{target}[{shard}]"


def _expected_pieces(params: dict[str, torch.nn.Parameter], config: ModelConfig) -> set[str]:
    """Every parameter, with fused ones split into the shards the checkpoint must provide."""
    pieces = set()
    for name in params:
        fused_name = name.split(".")[-2]
        if fused_name in ("qkv_proj", "gate_up_proj"):
            pieces.update(f"{name}[{i}]" for i in range(len(_shard_sizes(fused_name, config))))
        elif not (name == "lm_head.weight" and config.tie_word_embeddings):
            pieces.add(name)
    return pieces


def _shard_sizes(fused_name: str, config: ModelConfig) -> list[int]:
    if fused_name == "qkv_proj":
        kv = config.num_key_value_heads * config.head_dim
        return [config.num_attention_heads * config.head_dim, kv, kv]
    return [config.intermediate_size, config.intermediate_size]


def _checked_copy(dst: torch.Tensor, src: torch.Tensor, name: str) -> None:
    if dst.shape != src.shape:
        raise ValueError(
            f"weight {name!r} has shape {tuple(src.shape)}, expected {tuple(dst.shape)}"
        )
    with torch.no_grad():
        dst.copy_(src)
