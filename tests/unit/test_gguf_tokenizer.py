"""The tokenizer of a GGUF checkpoint: the same ids, text, special tokens and chat prompt as
transformers' tokenizer of the same file, for a GGUF written with the tiny model's tokenizer (which
must also equal that model's own ``tokenizer.json``) and for SmolLM2's where installed."""

from pathlib import Path

import pytest
import transformers

from pdserve.engine.tokenizer import Tokenizer
from pdserve.tests.gguf_models import smollm2_or_skip, write_gguf

# No digits here: SmolLM2's are split one by one (below), which transformers' GGUF tokenizer
# does not do.
TEXTS = (
    "",
    "Hello, world!",
    "  leading spaces and\ttabs\n\nnewlines  ",
    "naïve café, 中文分词, emoji 😀👍🏽",
    "<|im_start|>user\nliteral special tokens<|im_end|><|endoftext|>",
    "def f(x):\n    return x * y  # product",
)
CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi <there>!"},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": "Bye"},
]


@pytest.fixture(scope="module")
def tiny_gguf(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_gguf(path, tiny_model_dir)
    return path


# SmolLM2's: transformers reads its tokenizer from the GGUF in seconds.
@pytest.fixture(scope="module", params=["tiny", pytest.param("smollm2", marks=pytest.mark.slow)])
def gguf_path(request: pytest.FixtureRequest, tiny_gguf: Path) -> Path:
    return tiny_gguf if request.param == "tiny" else smollm2_or_skip()


@pytest.fixture(scope="module")
def ours(gguf_path: Path) -> Tokenizer:
    return Tokenizer.from_pretrained(gguf_path)


@pytest.fixture(scope="module")
def hf(gguf_path: Path) -> transformers.PreTrainedTokenizerBase:
    return transformers.AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)


@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_encode_and_decode_match_transformers(
    ours: Tokenizer, hf, add_special_tokens: bool
) -> None:
    for text in TEXTS:
        ids = ours.encode(text, add_special_tokens=add_special_tokens)
        assert ids == hf(text, add_special_tokens=add_special_tokens)["input_ids"], text
        for skip in (True, False):
            expected = hf.decode(ids, skip_special_tokens=skip)
            assert ours.decode(ids, skip_special_tokens=skip) == expected, text


def test_special_tokens_match_transformers(ours: Tokenizer, hf) -> None:
    assert (ours.bos_token_id, ours.eos_token_id, ours.pad_token_id) == (
        hf.bos_token_id,
        hf.eos_token_id,
        hf.pad_token_id,
    )
    assert ours.eos_token_ids[0] == hf.eos_token_id
    # What skip_special_tokens drops: transformers' GGUF tokenizer lists only the named tokens in
    # all_special_ids, though it drops every added special token too.
    dropped = {i for i, t in hf.added_tokens_decoder.items() if t.special}
    assert set(ours.all_special_ids) == dropped | set(hf.all_special_ids)
    assert ours.vocab_size == len(hf)


def test_chat_template_matches_transformers(ours: Tokenizer, hf) -> None:
    for add_generation_prompt in (True, False):
        text = ours.apply_chat_template(CHAT, add_generation_prompt=add_generation_prompt)
        assert text == hf.apply_chat_template(
            CHAT, tokenize=False, add_generation_prompt=add_generation_prompt
        )
        ids = ours.apply_chat_template(CHAT, add_generation_prompt, tokenize=True)
        assert ids == ours.encode(text, add_special_tokens=False)


def test_tiny_gguf_tokenizer_equals_the_models_own(tiny_gguf: Path, tiny_model_dir: Path) -> None:
    ours, own = Tokenizer.from_pretrained(tiny_gguf), Tokenizer.from_pretrained(tiny_model_dir)
    for text in (*TEXTS, "numbers 1234567890 3.14159e-10"):
        assert ours.encode(text) == own.encode(text), text
    assert ours.apply_chat_template(CHAT) == own.apply_chat_template(CHAT)
    assert ours.eos_token_ids == own.eos_token_ids[:1]  # the GGUF has no generation_config.json


def test_smollm2_ends_turns_and_splits_digits() -> None:
    tokenizer = Tokenizer.from_pretrained(smollm2_or_skip())
    im_end = tokenizer.backend.token_to_id("<|im_end|>")
    assert im_end in tokenizer.eos_token_ids
    reply = tokenizer.encode("Paris.<|im_end|>", add_special_tokens=False)
    assert reply[-1] == im_end and tokenizer.decode(reply) == "Paris."
    # As llama.cpp ("smollm" pre-tokenizer) and SmolLM2's own tokenizer.json split them.
    digits = tokenizer.convert_ids_to_tokens(tokenizer.encode("in 2024, 3.14", False))
    assert [t for t in digits if any(c.isdigit() for c in t)] == list("2024314")
