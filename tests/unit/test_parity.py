"""Greedy parity with Hugging Face transformers at fp32, on three architectures.

For 8 prompts of lengths 1..300 run as one batch: the last prompt position's logits match
transformers to 1e-4 and 32 greedy tokens equal ``generate(do_sample=False)`` token for token.
The engine's fp32 linears run oneDNN over packed weights for the prompts, the native product for
steps of up to 16 rows; one test runs the engine on one thread, to keep that path equal too. Under
``--quantization int8`` the engine's tokens equal transformers' on the checkpoint whose linear
weights are their Q8_0 values (what the engine serves).
"""

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import transformers

from pdserve import LLM, SamplingParams
from pdserve.engine.linear import quantized_linears
from pdserve.engine.quantization import dequantize_q8_0, quantize_q8_0
from pdserve.engine.tokenizer import Tokenizer

PROMPT_LENGTHS = (1, 7, 16, 33, 64, 129, 255, 300)
MAX_NEW_TOKENS = 32
LOGITS_ATOL = 1e-4
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
BIAS_STD = 0.5  # HF initialises biases to zero; make them count so a loading slip shows


def _save_hf_model(model: transformers.PreTrainedModel, src_tokenizer: Path, out: Path) -> Path:
    model.save_pretrained(out)
    for name in TOKENIZER_FILES:
        if (src_tokenizer / name).exists():
            shutil.copy(src_tokenizer / name, out / name)
    return out


def _small_config_kwargs(tokenizer: Tokenizer) -> dict:
    return dict(
        vocab_size=tokenizer.vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )


def _qwen2_model(tiny: Path, out: Path) -> Path:
    """qwen2: q/k/v bias, tied embeddings."""
    tokenizer = Tokenizer.from_pretrained(tiny)
    config = transformers.Qwen2Config(
        **_small_config_kwargs(tokenizer),
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        rope_theta=1000000.0,
    )
    torch.manual_seed(1)
    model = transformers.Qwen2ForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, BIAS_STD)
    return _save_hf_model(model, tiny, out)


def _llama3_model(tiny: Path, out: Path) -> Path:
    """llama: GQA 4:1, untied head, llama3 rope scaling active within the prompt lengths."""
    tokenizer = Tokenizer.from_pretrained(tiny)
    config = transformers.LlamaConfig(
        **_small_config_kwargs(tokenizer),
        num_attention_heads=8,
        num_key_value_heads=2,
        tie_word_embeddings=False,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 128,
        },
    )
    torch.manual_seed(2)
    return _save_hf_model(transformers.LlamaForCausalLM(config), tiny, out)


@pytest.fixture(scope="module", params=["tiny", "qwen2", "llama3"])
def model_dir(request, tiny_model_dir: Path, tmp_path_factory) -> Path:
    if request.param == "tiny":
        return tiny_model_dir
    build = {"qwen2": _qwen2_model, "llama3": _llama3_model}[request.param]
    return build(tiny_model_dir, tmp_path_factory.mktemp(request.param))


def _prompts(vocab_size: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, vocab_size, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]


@pytest.fixture(scope="module")
def hf_model(model_dir: Path) -> transformers.PreTrainedModel:
    return transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager"
    ).eval()


@pytest.fixture(scope="module")
def hf_greedy(hf_model: transformers.PreTrainedModel) -> list[list[int]]:
    return _hf_greedy_of(hf_model)


def _hf_greedy_of(hf_model: transformers.PreTrainedModel) -> list[list[int]]:
    """transformers' greedy continuation of each prompt, run alone (no padding)."""
    prompts = _prompts(hf_model.config.vocab_size)
    outputs = []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        out = hf_model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW_TOKENS, do_sample=False
        )
        outputs.append(out[0, len(prompt) :].tolist())
    return outputs


def test_last_position_logits_match(model_dir: Path, hf_model) -> None:
    """All 8 prompts' last-position logits, computed as one flattened batch by our engine."""
    engine = LLM(model=model_dir).engine
    prompts = _prompts(engine.model_config.vocab_size)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"logits-{i}", prompt, SamplingParams(max_tokens=1))
    batch = engine.scheduler.schedule()
    assert len(batch) == len(prompts)
    sampling, ours = engine.runner.execute(batch)
    for entry in sampling:
        engine.abort_request(entry.request.request_id)
    order = [int(e.request.request_id.split("-")[1]) for e in sampling]
    with torch.no_grad():
        for row, i in enumerate(order):
            theirs = hf_model(torch.tensor([prompts[i]])).logits[0, -1]
            diff = (ours[row] - theirs).abs().max().item()
            print(f"{model_dir.name}: prompt len {len(prompts[i])}: max |logit diff| = {diff:.2e}")
            assert diff < LOGITS_ATOL, f"prompt {i}: logits differ by {diff}"
    assert engine.block_pool.num_free_blocks == engine.block_pool.num_blocks


# None: every prompt is prefilled whole in the first step. 16: prompts are prefilled in 16-token
# chunks over their own cached prefix, in steps that mix decodes with other prompts' chunks.
@pytest.mark.parametrize("max_num_batched_tokens", [None, 16])
def test_greedy_tokens_equal_transformers(
    model_dir: Path, hf_greedy: list[list[int]], max_num_batched_tokens: int | None
) -> None:
    args = (
        {} if max_num_batched_tokens is None else {"max_num_batched_tokens": max_num_batched_tokens}
    )
    llm = LLM(model=model_dir, **args)
    assert llm.engine.runner.model.lm_head.packed_weight is not None
    _assert_greedy_equal(llm, hf_greedy)
    pool = llm.engine.block_pool
    assert pool.num_free_blocks == pool.num_blocks


def test_greedy_tokens_equal_transformers_on_one_thread(
    model_dir: Path, hf_greedy: list[list[int]], torch_threads: Callable[[int], None]
) -> None:
    torch_threads(1)
    llm = LLM(model=model_dir)
    _assert_greedy_equal(llm, hf_greedy)


def test_greedy_tokens_equal_transformers_alone(
    model_dir: Path, hf_greedy: list[list[int]]
) -> None:
    # Each prompt on its own: steps of one row, in one native call.
    llm = LLM(model=model_dir)
    prompts = _prompts(llm.engine.model_config.vocab_size)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS)
    for prompt, expected in zip(prompts, hf_greedy, strict=True):
        [output] = llm.generate([prompt], params)
        assert output.token_ids == expected, f"prompt of {len(prompt)} tokens diverged"


@pytest.fixture(scope="module")
def q8_model_dir(model_dir: Path, tmp_path_factory) -> Path:
    """``model_dir``'s checkpoint with every linear weight (the head's too) replaced by its Q8_0
    blocks' values: the weights pdserve serves under ``--quantization int8``, in fp32."""
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.copy_(dequantize_q8_0(*quantize_q8_0(module.weight)))
    return _save_hf_model(model, model_dir, tmp_path_factory.mktemp(f"{model_dir.name}-q8"))


@pytest.mark.slow
@pytest.mark.parametrize("alone", [False, True])
def test_int8_greedy_tokens_equal_transformers_on_the_same_values(
    q8_model_dir: Path, alone: bool
) -> None:
    # int8 weights are served as d * q exactly, so transformers on those values in fp32 is the
    # reference: batched (steps of many decodes in the one native call) and each prompt alone.
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        q8_model_dir, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    expected = _hf_greedy_of(hf)
    llm = LLM(model=q8_model_dir, quantization="int8")
    assert llm.engine.runner.model.lm_head.quantized
    # Both ways of an int8 product, whichever this CPU chose at load: the batched prompts' many
    # rows over W dequantized, each prompt alone in the native kernel.
    for linear in quantized_linears(llm.engine.runner.model):
        linear.dequantize_from_rows = None if alone else 64
    if not alone:
        _assert_greedy_equal(llm, expected)
        return
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS)
    for prompt, tokens in zip(_prompts(hf.config.vocab_size), expected, strict=True):
        [output] = llm.generate([prompt], params)
        assert output.token_ids == tokens, f"prompt of {len(prompt)} tokens diverged"


def _assert_greedy_equal(llm: LLM, hf_greedy: list[list[int]]) -> None:
    prompts = _prompts(llm.engine.model_config.vocab_size)
    outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS))
    for prompt, output, expected in zip(prompts, outputs, hf_greedy, strict=True):
        assert output.token_ids == expected, f"prompt of {len(prompt)} tokens diverged"
