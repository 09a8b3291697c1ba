"""Write a built-in Llama model (random weights, trained BPE tokenizer) in Hugging Face format.

The model needs no download: the byte-level BPE tokenizer is trained here on text shipped in
``cluster/data/``, and the weights are seeded random draws initialised the way transformers does.
The same preset always gives byte-identical files.
"""

import argparse
import json
import lzma
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from pdserve.cluster.presets import PRESETS, preset_config
from pdserve.engine.config import ModelConfig

CORPUS = Path(__file__).with_name("data") / "corpus.txt.xz"
SEED = 0
INITIALIZER_RANGE = 0.02  # transformers' default std for Linear and Embedding weights
RMS_NORM_EPS = 1e-6
ROPE_THETA = 10000.0

# Special tokens come first, so they get ids 0, 1, 2 in every preset.
ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
BOS_TOKEN = ENDOFTEXT  # GPT-2's habit: one token both opens a document and separates documents
EOS_TOKEN = IM_END  # a chat turn ends the reply; <|endoftext|> is a second stop id
PAD_TOKEN = ENDOFTEXT

# ChatML, as Qwen2 writes it, minus the default system prompt. Content may be a string or a list of
# OpenAI-style parts; only the text parts are kept.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['content'] is string %}{%- set content = message['content'] %}"
    "{%- else %}{%- set content = message['content'] | selectattr('type', 'equalto', 'text')"
    " | map(attribute='text') | join('') %}{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def train_tokenizer(vocab_size: int) -> Tokenizer:
    """Trains a byte-level BPE tokenizer of exactly ``vocab_size`` ids on the shipped corpus."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=0,  # the corpus is small; rare merges are needed to reach 32k ids
        special_tokens=list(SPECIAL_TOKENS),
        # all 256 bytes, so any text encodes even if a byte never occurs in the corpus
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    text = lzma.decompress(CORPUS.read_bytes()).decode("utf-8")
    # Training is deterministic for a fixed input order (ties between merges break on pair ids).
    tokenizer.train_from_iterator(text.split("\n\n"), trainer=trainer)
    if tokenizer.get_vocab_size() != vocab_size:
        raise RuntimeError(
            f"the corpus {CORPUS} yields only {tokenizer.get_vocab_size()} BPE ids, "
            f"fewer than the {vocab_size} the preset asks for"
        )
    bos_id = tokenizer.token_to_id(BOS_TOKEN)
    # BOS before every sequence, as Llama does, in the form transformers itself writes.
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN}:0 $A:0",
        pair=f"{BOS_TOKEN}:0 $A:0 {BOS_TOKEN}:1 $B:1",
        special_tokens=[(BOS_TOKEN, bos_id)],
    )
    return tokenizer


def make_weights(preset: ModelConfig, seed: int = SEED) -> dict[str, torch.Tensor]:
    """Random fp32 weights under transformers' Llama names: N(0, 0.02) matrices, unit RMSNorms."""
    generator = torch.Generator().manual_seed(seed)
    h, hd = preset.hidden_size, preset.head_dim

    def normal(*shape: int) -> torch.Tensor:
        return torch.empty(shape).normal_(0.0, INITIALIZER_RANGE, generator=generator)

    # Drawn in a fixed order, so the seed alone fixes every tensor.
    weights = {"model.embed_tokens.weight": normal(preset.vocab_size, h)}
    for i in range(preset.num_hidden_layers):
        p = f"model.layers.{i}."
        weights[p + "self_attn.q_proj.weight"] = normal(preset.num_attention_heads * hd, h)
        weights[p + "self_attn.k_proj.weight"] = normal(preset.num_key_value_heads * hd, h)
        weights[p + "self_attn.v_proj.weight"] = normal(preset.num_key_value_heads * hd, h)
        weights[p + "self_attn.o_proj.weight"] = normal(h, preset.num_attention_heads * hd)
        weights[p + "mlp.gate_proj.weight"] = normal(preset.intermediate_size, h)
        weights[p + "mlp.up_proj.weight"] = normal(preset.intermediate_size, h)
        weights[p + "mlp.down_proj.weight"] = normal(h, preset.intermediate_size)
        weights[p + "input_layernorm.weight"] = torch.ones(h)
        weights[p + "post_attention_layernorm.weight"] = torch.ones(h)
    weights["model.norm.weight"] = torch.ones(h)
    if not preset.tie_word_embeddings:
        # A tied checkpoint has no lm_head tensor at all, as transformers saves it.
        weights["lm_head.weight"] = normal(preset.vocab_size, h)
    return weights


def model_config(preset: str, tokenizer: Tokenizer) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **PRESETS[preset],
        "vocab_size": tokenizer.get_vocab_size(),
        "hidden_act": "silu",
        "initializer_range": INITIALIZER_RANGE,
        "rms_norm_eps": RMS_NORM_EPS,
        "rope_theta": ROPE_THETA,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "bos_token_id": tokenizer.token_to_id(BOS_TOKEN),
        "eos_token_id": tokenizer.token_to_id(EOS_TOKEN),
        "torch_dtype": "float32",
        "use_cache": True,
    }


def generation_config(tokenizer: Tokenizer) -> dict[str, Any]:
    return {
        "bos_token_id": tokenizer.token_to_id(BOS_TOKEN),
        # Like Qwen2-Instruct: stop at the end of a chat turn or of a document.
        "eos_token_id": [tokenizer.token_to_id(EOS_TOKEN), tokenizer.token_to_id(ENDOFTEXT)],
        "pad_token_id": tokenizer.token_to_id(PAD_TOKEN),
    }


def tokenizer_config(preset: ModelConfig, tokenizer: Tokenizer) -> dict[str, Any]:
    added = {
        str(tokenizer.token_to_id(token)): {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for token in SPECIAL_TOKENS
    }
    return {
        "added_tokens_decoder": added,
        "additional_special_tokens": [IM_START, IM_END],
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "model_max_length": preset.max_position_embeddings,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }


def special_tokens_map() -> dict[str, Any]:
    return {
        "additional_special_tokens": [IM_START, IM_END],
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
    }


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def make_model(preset: str, out_dir: str | Path) -> Path:
    """Writes the preset's model to ``out_dir`` (created if needed) and returns the directory."""
    spec = preset_config(preset)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()

    print(f"make-model: training a {spec.vocab_size}-id byte-level BPE tokenizer", flush=True)
    tokenizer = train_tokenizer(spec.vocab_size)
    tokenizer.save(str(out / "tokenizer.json"), pretty=True)
    _write_json(out / "tokenizer_config.json", tokenizer_config(spec, tokenizer))
    _write_json(out / "special_tokens_map.json", special_tokens_map())

    print(f"make-model: drawing {spec.num_parameters / 1e6:.1f}M random fp32 weights", flush=True)
    _write_json(out / "config.json", model_config(preset, tokenizer))
    _write_json(out / "generation_config.json", generation_config(tokenizer))
    weights_file = out / "model.safetensors"
    save_file(make_weights(spec), weights_file, metadata={"format": "pt"})
    # safetensors writes through a private temp file (mode 0600); give it the umask's mode instead.
    shutil.copymode(out / "config.json", weights_file)

    print(f"make-model: wrote {preset} to {out} in {time.perf_counter() - start:.1f}s", flush=True)
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--out", required=True, help="directory to write the checkpoint into")


def run(args: argparse.Namespace) -> int:
    make_model(args.preset, args.out)
    return 0
