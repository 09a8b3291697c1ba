"""Tokenizer and incremental detokenizer: the same ids, text and chat prompts as transformers."""

import json
import pickle
import random
import shutil
from pathlib import Path

import jinja2
import pytest
import transformers

from pdserve.engine.detokenizer import IncrementalDetokenizer
from pdserve.engine.tokenizer import Tokenizer

REPLACEMENT_CHAR = "\ufffd"
TEXTS = (
    "",
    "Hello, world!",
    "  leading spaces and\ttabs\n\nnewlines  ",
    "def f(x):\n    return x ** 2  # squares",
    "naïve café, Ångström, façade, jalapeño",
    "中文分词测试：你好，世界。",
    "emoji 😀👍🏽 and flags 🇫🇷, zero-width\u200bjoiner",
    "<|im_start|>user\nliteral special tokens<|im_end|><|endoftext|>",
    "numbers 1234567890 3.14159e-10",
)
CHATS = (
    [{"role": "user", "content": "Hi!"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "中文 😀?"},
        {"role": "assistant", "content": "Sure."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "part one, "}, {"type": "text", "text": "two"}],
        },
    ],
    [{"role": "user", "content": "x"}, {"role": "assistant", "content": None, "tool_calls": []}],
)
# Exercises what transformers adds to jinja: bos_token in context, tojson, loopcontrols, generation.
CUSTOM_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m.role == 'skip' %}{% continue %}{% endif %}"
    "{% generation %}{{ m | tojson }}{% endgeneration %}\n{% endfor %}{{ greeting | default('') }}"
)


@pytest.fixture(scope="module")
def tok(tiny_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def hf(tiny_model_dir: Path) -> transformers.PreTrainedTokenizerBase:
    return transformers.AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_encode_matches_transformers(tok: Tokenizer, hf, add_special_tokens: bool) -> None:
    for text in TEXTS:
        expected = hf(text, add_special_tokens=add_special_tokens)["input_ids"]
        assert tok.encode(text, add_special_tokens=add_special_tokens) == expected, text


@pytest.mark.parametrize("skip", [True, False])
def test_decode_matches_transformers(tok: Tokenizer, hf, skip: bool) -> None:
    rng = random.Random(0)
    for _ in range(50):
        ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randrange(1, 40))]
        assert tok.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)
    for text in TEXTS:
        assert (
            tok.decode(tok.encode(text, add_special_tokens=False), skip_special_tokens=False)
            == text
        )


def test_special_ids_match_transformers(tok: Tokenizer, hf) -> None:
    assert tok.vocab_size == len(hf)
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (
        hf.bos_token_id,
        hf.eos_token_id,
        hf.pad_token_id,
    )
    assert set(tok.all_special_ids) == set(hf.all_special_ids)
    assert tok.convert_ids_to_tokens([0, 1, 2, 300]) == hf.convert_ids_to_tokens([0, 1, 2, 300])
    assert tok.model_max_length == hf.model_max_length
    # generation_config.json lists <|im_end|> and <|endoftext|>; the tokenizer's EOS comes first.
    assert tok.eos_token_ids == (tok.eos_token_id, tok.bos_token_id)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.convert_ids_to_tokens([tok.vocab_size])


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_transformers(
    tok: Tokenizer, hf, add_generation_prompt: bool
) -> None:
    for chat in CHATS:
        kwargs = {"add_generation_prompt": add_generation_prompt}
        expected = hf.apply_chat_template(chat, tokenize=False, **kwargs)
        assert tok.apply_chat_template(chat, **kwargs) == expected
        expected_ids = hf.apply_chat_template(chat, tokenize=True, return_dict=False, **kwargs)
        assert tok.apply_chat_template(chat, tokenize=True, **kwargs) == expected_ids


def test_chat_template_environment_matches_transformers(tok: Tokenizer, hf) -> None:
    custom = Tokenizer(tok.backend, tok.special_tokens, chat_template=CUSTOM_TEMPLATE)
    chat = [*CHATS[1], {"role": "skip", "content": "hidden"}]
    expected = hf.apply_chat_template(
        chat, chat_template=CUSTOM_TEMPLATE, tokenize=False, greeting="héllo"
    )
    assert custom.apply_chat_template(chat, greeting="héllo") == expected
    assert "hidden" not in expected and "中文" in expected  # tojson leaves non-ASCII alone


def test_chat_template_raise_exception(tok: Tokenizer) -> None:
    template = "{{ raise_exception('roles must alternate') }}"
    failing = Tokenizer(tok.backend, tok.special_tokens, chat_template=template)
    with pytest.raises(jinja2.TemplateError, match="roles must alternate"):
        failing.apply_chat_template(CHATS[0])


def test_no_chat_template_is_a_clear_error(tok: Tokenizer) -> None:
    plain = Tokenizer(tok.backend, tok.special_tokens)
    with pytest.raises(ValueError, match="no chat template"):
        plain.apply_chat_template(CHATS[0])


def _edited_copy(src: Path, dst: Path, **changes: object) -> Path:
    shutil.copytree(src, dst)
    config_file = dst / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config.update(changes)
    config_file.write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    return dst


def test_post_processor_decides_bos_like_transformers(tiny_model_dir: Path, tmp_path: Path) -> None:
    # transformers 5 ignores add_bos_token when tokenizer.json exists; so must we.
    model_dir = _edited_copy(tiny_model_dir, tmp_path / "m", add_bos_token=False)
    expected = transformers.AutoTokenizer.from_pretrained(model_dir)("Hi there")["input_ids"]
    assert Tokenizer.from_pretrained(model_dir).encode("Hi there") == expected


def test_chat_template_file_is_read(tok: Tokenizer, tiny_model_dir: Path, tmp_path: Path) -> None:
    # The file wins over the config's entry, as in transformers.
    model_dir = _edited_copy(tiny_model_dir, tmp_path / "m")
    (model_dir / "chat_template.jinja").write_text(CUSTOM_TEMPLATE)
    expected = transformers.AutoTokenizer.from_pretrained(model_dir).apply_chat_template(
        CHATS[1], tokenize=False
    )
    assert Tokenizer.from_pretrained(model_dir).apply_chat_template(CHATS[1]) == expected
    assert expected.startswith("<|endoftext|>{")


def test_legacy_special_tokens_map(tiny_model_dir: Path, tmp_path: Path) -> None:
    model_dir = _edited_copy(
        tiny_model_dir, tmp_path / "m", eos_token=None, added_tokens_decoder=None
    )
    hf = transformers.AutoTokenizer.from_pretrained(model_dir)
    assert Tokenizer.from_pretrained(model_dir).eos_token_id == hf.eos_token_id is not None


@pytest.mark.parametrize("missing", ["tokenizer.json", "tokenizer_config.json"])
def test_missing_file_is_named(tiny_model_dir: Path, tmp_path: Path, missing: str) -> None:
    model_dir = _edited_copy(tiny_model_dir, tmp_path / "m")
    (model_dir / missing).unlink()
    with pytest.raises(FileNotFoundError, match=missing):
        Tokenizer.from_pretrained(model_dir)


def test_pickles(tok: Tokenizer) -> None:
    # Ray ships the tokenizer to replicas by pickling it.
    copy = pickle.loads(pickle.dumps(tok))
    assert copy.encode(TEXTS[5]) == tok.encode(TEXTS[5])
    assert copy.apply_chat_template(CHATS[0]) == tok.apply_chat_template(CHATS[0])


def _stream(tok: Tokenizer, prompt: list[int], output: list[int], skip: bool) -> list[str]:
    detok = IncrementalDetokenizer(tok, prompt, skip_special_tokens=skip)
    deltas = [detok.add_token(t) for t in output]
    assert "".join(deltas) == detok.text
    return deltas


@pytest.mark.parametrize("skip", [True, False])
def test_detokenizer_random_ids(tok: Tokenizer, skip: bool) -> None:
    rng = random.Random(1)
    for _ in range(300):
        prompt = [rng.randrange(tok.vocab_size) for _ in range(rng.randrange(0, 12))]
        output = [rng.randrange(tok.vocab_size) for _ in range(rng.randrange(1, 50))]
        deltas = _stream(tok, prompt, output, skip)
        full = tok.decode(output, skip_special_tokens=skip)
        if full.endswith(REPLACEMENT_CHAR):
            # A trailing partial character is held back until a token completes it.
            assert full.startswith("".join(deltas))
        else:
            assert "".join(deltas) == full
        if REPLACEMENT_CHAR not in full:
            assert not any(REPLACEMENT_CHAR in d for d in deltas)


def test_detokenizer_multibyte_text(tok: Tokenizer) -> None:
    prompt = tok.encode("Say it:")
    for text in TEXTS[3:7]:
        output = tok.encode(text, add_special_tokens=False)
        deltas = _stream(tok, prompt, output, skip=True)
        assert "".join(deltas) == text == tok.decode(output)
        assert not any(REPLACEMENT_CHAR in d for d in deltas)
    # Byte-level BPE splits this emoji over several tokens: nothing shows until the last one.
    emoji = tok.encode("😀", add_special_tokens=False)
    assert len(emoji) > 1
    assert _stream(tok, prompt, emoji, skip=True) == [""] * (len(emoji) - 1) + ["😀"]


def test_detokenizer_special_tokens(tok: Tokenizer) -> None:
    output = [*tok.encode(" one", add_special_tokens=False), tok.eos_token_id]
    output += tok.encode(" two", add_special_tokens=False)
    assert "".join(_stream(tok, [], output, skip=True)) == " one two"
    assert "".join(_stream(tok, [], output, skip=False)) == " one<|im_end|> two"
