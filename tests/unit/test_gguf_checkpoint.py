"""GGUF checkpoints: the config from the metadata; every supported tensor type loaded as the gguf
package dequantizes it, q and k rows back in HF's order; the same logits as transformers' own GGUF
load; one clear line, and a failed CLI, for a file pdserve cannot load."""

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader

from pdserve import LLM, SamplingParams
from pdserve.cluster.cli import main
from pdserve.engine.config import ModelConfig, RopeScaling
from pdserve.engine.errors import CheckpointError
from pdserve.engine.gguf_checkpoint import SUPPORTED_TENSOR_TYPES
from pdserve.engine.loader import FUSED, load_model
from pdserve.tests import gguf_models as g

LOGITS_ATOL = 1e-4
PROMPT_LENGTH = 40


def _model_weights(path: Path, config: ModelConfig) -> dict[str, torch.Tensor]:
    """The loaded model's weights under HF's names, its fused q/k/v and gate/up split back."""
    params = dict(load_model(path, config, torch.float32, torch.device("cpu")).named_parameters())
    q, kv, inter = (
        config.num_attention_heads * config.head_dim,
        config.num_key_value_heads * config.head_dim,
        config.intermediate_size,
    )
    shards = {"qkv_proj": [q, kv, kv], "gate_up_proj": [inter, inter]}
    weights = {}
    for name, param in params.items():
        *stem, module, leaf = name.split(".")
        if module not in shards:
            weights[name] = param.detach()
            continue
        pieces = param.detach().split(shards[module])
        for hf_module, (fused, index) in FUSED.items():
            if fused == module:
                weights[".".join([*stem, hf_module, leaf])] = pieces[index]
    return weights


def test_config_from_metadata(tmp_path: Path, tiny_model_dir: Path) -> None:
    path = tmp_path / "model.gguf"
    g.write_gguf(path, tiny_model_dir, tied=False)
    config = ModelConfig.from_pretrained(path)
    assert (config.model_type, config.hidden_size, config.intermediate_size) == (
        "llama",
        g.HIDDEN,
        g.INTERMEDIATE,
    )
    assert (config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads) == (
        g.LAYERS,
        g.HEADS,
        g.KV_HEADS,
    )
    assert (config.head_dim, config.max_position_embeddings) == (g.HEAD_DIM, g.CONTEXT)
    assert (config.rms_norm_eps, config.rope_theta) == (pytest.approx(g.RMS_NORM_EPS), g.ROPE_THETA)
    assert config.vocab_size == ModelConfig.from_pretrained(tiny_model_dir).vocab_size
    assert not config.tie_word_embeddings and not config.attention_bias
    assert (config.bos_token_id, config.eos_token_ids) == (0, (2,))
    # A folder holding one GGUF file and no config.json names that file.
    assert ModelConfig.from_pretrained(tmp_path) == config


@pytest.mark.parametrize("qtype", SUPPORTED_TENSOR_TYPES, ids=lambda q: q.name)
def test_weights_equal_gguf_dequantization(
    qtype: Q, tmp_path: Path, tiny_model_dir: Path, torch_threads: Callable[[int], None]
) -> None:
    torch_threads(1)  # the plain weights, not oneDNN's packed copies
    path = tmp_path / f"{qtype.name}.gguf"
    expected = g.write_gguf(path, tiny_model_dir, qtype, tied=False)
    weights = _model_weights(path, ModelConfig.from_pretrained(path))
    assert weights.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(weights[name], torch.from_numpy(tensor)), name


def test_qwen2_keeps_its_rows_and_biases(
    tmp_path: Path, tiny_model_dir: Path, torch_threads: Callable[[int], None]
) -> None:
    """llama.cpp's converter reorders q and k for llama and mistral, not for qwen2."""
    torch_threads(1)
    path = tmp_path / "qwen2.gguf"
    expected = g.write_gguf(path, tiny_model_dir, Q.Q8_0, arch="qwen2")
    config = ModelConfig.from_pretrained(path)
    assert config.attention_bias and config.tie_word_embeddings
    weights = _model_weights(path, config)
    for name, tensor in expected.items():
        assert torch.equal(weights[name], torch.from_numpy(tensor)), name


@pytest.mark.slow  # transformers' GGUF load and two models' forwards
@pytest.mark.parametrize(("arch", "qtype"), [("llama", Q.Q4_K), ("qwen2", Q.Q8_0)])
def test_logits_equal_transformers_gguf_load(
    arch: str, qtype: Q, tmp_path: Path, tiny_model_dir: Path
) -> None:
    pytest.importorskip("accelerate", reason="transformers loads a GGUF only with accelerate")
    path = tmp_path / "model.gguf"
    g.write_gguf(path, tiny_model_dir, qtype, arch=arch, tied=arch == "qwen2")
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file=path.name, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    engine = LLM(model=path).engine
    prompt = np.random.default_rng(0).integers(0, engine.model_config.vocab_size, PROMPT_LENGTH)
    engine.add_request("logits", prompt.tolist(), SamplingParams(max_tokens=1))
    _, ours = engine.runner.execute(engine.scheduler.schedule())
    engine.abort_request("logits")
    with torch.no_grad():
        theirs = hf(torch.tensor([prompt.tolist()])).logits[0, -1]
    assert (ours[0] - theirs).abs().max().item() < LOGITS_ATOL


def test_llama3_rope_scaling_from_rope_freqs(
    tmp_path: Path, tiny_model_dir: Path, torch_threads: Callable[[int], None]
) -> None:
    """llama.cpp keeps Llama 3's rope scaling as divisors; the config gets its parameters back, and
    the load checks that they give those divisors."""
    torch_threads(1)
    path = tmp_path / "llama3.gguf"
    g.write_gguf(path, tiny_model_dir, rope_freqs=g.llama3_rope_freqs(8.0, 1.0, 4.0, 8192))
    config = ModelConfig.from_pretrained(path)
    assert config.rope_scaling == RopeScaling("llama3", 8.0, 1.0, 4.0, 8192)
    load_model(path, config, torch.float32, torch.device("cpu"))
    g.write_gguf(path, tiny_model_dir, rope_freqs=g.llama3_rope_freqs(8.0, 1.0, 2.0, 8192))
    with pytest.raises(CheckpointError, match="not Llama 3's rope scaling"):
        load_model(path, ModelConfig.from_pretrained(path), torch.float32, torch.device("cpu"))


def _truncated(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _retyped(type_id: int) -> Callable[[Path], None]:
    def retype(path: Path) -> None:
        reader = GGUFReader(path, "r+")  # the tensor table, mapped writable
        reader.tensors[0].field.parts[4][0] = type_id  # [name len, name, dims, dims, type, offset]
        reader.data.flush()

    return retype


def _rearchitected(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data.replace(b"llama", b"gemma", 1))  # general.architecture's value


# (how the file is spoiled, what its one line must say)
SPOILED = {
    "truncated": (_truncated, "is truncated or not a GGUF file"),
    "unknown type": (_retyped(250), "holds a tensor of unknown GGUF type 250 (pdserve loads"),
    "unsupported type": (_retyped(Q.Q2_K), "is of type Q2_K, which pdserve does not load"),
    "architecture": (_rearchitected, "GGUF architecture 'gemma' is not supported"),
}


@pytest.mark.parametrize("case", SPOILED)
def test_a_file_pdserve_cannot_load_is_one_line(
    case: str, tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spoil, message = SPOILED[case]
    path = tmp_path / "bad.gguf"
    g.write_gguf(path, tiny_model_dir)
    spoil(path)
    with pytest.raises(CheckpointError, match=message.replace("(", r"\(")) as error:
        ModelConfig.from_pretrained(path)
    assert str(path) in str(error.value) and "\n" not in str(error.value)
    for command in (
        ["generate", "--model", str(path), "--prompt", "Hi"],
        ["serve", "--model", str(path)],  # refused before Ray starts
    ):
        assert main(command) == 1
        err = capsys.readouterr().err
        assert "Traceback" not in err
        assert err.splitlines()[-1] == f"pdserve: error: {error.value}", command


def test_a_folder_with_several_gguf_files_is_refused(tmp_path: Path, tiny_model_dir: Path) -> None:
    g.write_gguf(tmp_path / "a.gguf", tiny_model_dir)
    shutil.copy(tmp_path / "a.gguf", tmp_path / "b.gguf")
    with pytest.raises(CheckpointError, match="several GGUF files"):
        ModelConfig.from_pretrained(tmp_path)
