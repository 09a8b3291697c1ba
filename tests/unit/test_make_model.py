"""The built-in model: a full HF checkpoint that transformers loads, the same bytes every time."""

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from safetensors import safe_open

from pdserve.cluster.make_model import make_model, make_weights
from pdserve.cluster.presets import preset_config

FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
)
NEW_TOKENS = 8


def _digests(model_dir: Path) -> dict[str, str]:
    return {name: hashlib.sha256((model_dir / name).read_bytes()).hexdigest() for name in FILES}


def _config(model_dir: Path) -> dict:
    return json.loads((model_dir / "config.json").read_text())


def test_writes_a_complete_llama_checkpoint(tiny_model_dir: Path) -> None:
    assert sorted(p.name for p in tiny_model_dir.iterdir()) == sorted(FILES)
    config = _config(tiny_model_dir)
    preset = preset_config("tiny")
    assert config["model_type"] == "llama"
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["torch_dtype"] == "float32"
    assert config["max_position_embeddings"] == 2048
    assert config["rope_theta"] == 10000.0
    assert config["tie_word_embeddings"] is True
    assert config["vocab_size"] == preset.vocab_size
    tokenizer_config = json.loads((tiny_model_dir / "tokenizer_config.json").read_text())
    assert tokenizer_config["model_max_length"] == 2048
    assert "<|im_start|>" in tokenizer_config["chat_template"]


@pytest.mark.slow  # a fresh interpreter: seconds of imports
def test_byte_identical_across_processes(tiny_model_dir: Path, tmp_path: Path) -> None:
    # A second build, through the CLI in a fresh process: nothing may hang on hash seeds or threads.
    out = tmp_path / "again"
    cmd = [sys.executable, "-m", "pdserve.cluster.cli", "make-model", "--preset", "tiny"]
    result = subprocess.run([*cmd, "--out", str(out)], capture_output=True, text=True, check=True)
    assert str(out) in result.stdout
    assert _digests(out) == _digests(tiny_model_dir)


def test_vocab_covers_every_tokenizer_id(tiny_model_dir: Path) -> None:
    # Random weights sample any id below vocab_size; each must decode, and each token needs a row.
    tokenizer = json.loads((tiny_model_dir / "tokenizer.json").read_text())
    ids = set(tokenizer["model"]["vocab"].values()) | {t["id"] for t in tokenizer["added_tokens"]}
    vocab_size = _config(tiny_model_dir)["vocab_size"]
    assert ids == set(range(vocab_size))
    with safe_open(tiny_model_dir / "model.safetensors", "pt") as weights:
        assert weights.get_slice("model.embed_tokens.weight").get_shape()[0] == vocab_size
        assert "lm_head.weight" not in set(weights.keys())  # tied


def test_weights_follow_hf_init() -> None:
    preset = preset_config("tiny")
    weights = make_weights(preset)
    assert all(w.dtype == torch.float32 for w in weights.values())
    assert torch.equal(weights["model.norm.weight"], torch.ones(preset.hidden_size))
    std = weights["model.layers.0.mlp.up_proj.weight"].std().item()
    assert std == pytest.approx(0.02, rel=0.05)
    assert sum(w.numel() for w in weights.values()) == preset.num_parameters


def test_transformers_loads_and_generates(tiny_model_dir: Path) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    assert model.dtype == torch.float32
    assert model.num_parameters() == preset_config("tiny").num_parameters
    inputs = tokenizer("The cache holds", return_tensors="pt")
    assert inputs["input_ids"][0, 0].item() == tokenizer.bos_token_id
    out = model.generate(**inputs, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS)
    new_ids = out[0, inputs["input_ids"].shape[1] :].tolist()
    assert len(new_ids) == NEW_TOKENS
    assert all(0 <= i < len(tokenizer) for i in new_ids)
    assert isinstance(tokenizer.decode(new_ids), str)


def test_unknown_preset_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        make_model("huge", tmp_path)


@pytest.mark.slow
def test_small_preset(tmp_path: Path) -> None:
    out = make_model("small", tmp_path / "small")
    config = _config(out)
    preset = preset_config("small")
    assert config["vocab_size"] == preset.vocab_size == 32000
    assert config["max_position_embeddings"] == 4096
    assert config["tie_word_embeddings"] is False
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert model.num_parameters() == preset.num_parameters
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    shutil.rmtree(out)  # 0.5 GB; pytest would keep it around for three runs
