"""``bench peers`` writes the checkpoint llama.cpp serves: the same GGUF with its matrices in
F32, F16 or Q8_0. Each loads as what that type makes of the source's own dequantized weights,
with the same config, tokenizer and chat template."""

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader, Keys
from gguf.quants import dequantize, quantize

from pdserve.benchmarks.peers.gguf_retype import TARGETS, retype
from pdserve.engine.config import ModelConfig
from pdserve.engine.tokenizer import Tokenizer
from pdserve.tests import gguf_models as g
from pdserve.tests.unit.test_gguf_checkpoint import _model_weights

TEXT = "The same weights, the same tokens: 12 apples."


def _as(target: str, weights: np.ndarray) -> np.ndarray:
    """What a matrix (2-D) becomes in a ``target`` file; 1-D tensors stay as they are."""
    if weights.ndim == 1 or target == "f32":
        return weights
    if target == "f16":
        return weights.astype(np.float16).astype(np.float32)
    return dequantize(quantize(weights, Q.Q8_0), Q.Q8_0).reshape(weights.shape)


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_retyped_checkpoint_loads_the_same_weights_in_the_new_type(
    target: str, tmp_path: Path, tiny_model_dir: Path, torch_threads: Callable[[int], None]
) -> None:
    torch_threads(1)  # the plain weights, not oneDNN's packed copies
    src, dst = tmp_path / "src.gguf", tmp_path / "dst" / "model.gguf"
    dst.parent.mkdir()
    expected = g.write_gguf(src, tiny_model_dir, Q.Q4_1, tied=False)
    assert retype(src, dst, target) == dst

    config = ModelConfig.from_pretrained(dst)
    assert config == ModelConfig.from_pretrained(src)
    weights = _model_weights(dst, config)
    assert weights.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(weights[name], torch.from_numpy(_as(target, tensor))), name

    reader, source = GGUFReader(dst), GGUFReader(src)
    qtype, file_type = TARGETS[target]
    types = {t.name: t.tensor_type for t in reader.tensors}
    assert {types[t.name] for t in reader.tensors if len(t.shape) > 1} == {qtype}
    assert {types[t.name] for t in reader.tensors if len(t.shape) == 1} == {Q.F32}
    assert reader.fields[Keys.General.FILE_TYPE].contents() == file_type
    copied = {key for key in source.fields if not key.startswith("GGUF.")} - {
        Keys.General.FILE_TYPE
    }
    for key in copied:
        assert reader.fields[key].contents() == source.fields[key].contents(), key
    assert Tokenizer.from_pretrained(dst).encode(TEXT) == Tokenizer.from_pretrained(src).encode(
        TEXT
    )


def test_an_unknown_type_is_refused_before_anything_is_written(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    src = tmp_path / "src.gguf"
    g.write_gguf(src, tiny_model_dir)
    with pytest.raises(ValueError, match="q4_k"):
        retype(src, tmp_path / "dst.gguf", "q4_k")
    assert not (tmp_path / "dst.gguf").exists()
