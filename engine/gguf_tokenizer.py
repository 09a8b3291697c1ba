"""The tokenizer a GGUF file describes: byte-level BPE (``tokenizer.ggml.model`` "gpt2") rebuilt
from the vocabulary, merges and token types in its metadata as transformers rebuilds it, with the
split of the text that llama.cpp applies for the file's ``tokenizer.ggml.pre``."""

from collections.abc import Iterable
from pathlib import Path

from gguf import GGUFReader, Keys, TokenType
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as Backend

from pdserve.engine.errors import CheckpointError
from pdserve.engine.gguf_checkpoint import metadata, open_gguf
from pdserve.engine.tokenizer import Tokenizer

BYTE_LEVEL_BPE = "gpt2"  # the one `tokenizer.ggml.model` supported
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
GPT2_SPLIT, DIGITS_THEN_GPT2 = "gpt2", "digits"  # splits the ByteLevel step makes itself
# `tokenizer.ggml.pre` -> how llama.cpp splits text before byte-level BPE (llama-vocab.cpp): a
# regex of its own, GPT-2's, or GPT-2's after every digit on its own (SmolLM's tokenizer.json
# says the same with its Digits pre-tokenizer).
PRE_TOKENIZER_SPLITS = {
    "default": GPT2_SPLIT,
    "gpt-2": GPT2_SPLIT,
    "smollm": DIGITS_THEN_GPT2,
    "starcoder": DIGITS_THEN_GPT2,
    "llama-bpe": _LLAMA3,
    "llama3": _LLAMA3,
    "llama-v3": _LLAMA3,
    "smaug-bpe": _LLAMA3,
    "qwen2": _QWEN2,
    "deepseek-r1-qwen": _QWEN2,
    "tekken": _TEKKEN,
}
# The named special tokens (as tokenizer_config.json names them) and their metadata keys.
SPECIAL_TOKEN_IDS = {
    "bos_token": Keys.Tokenizer.BOS_ID,
    "eos_token": Keys.Tokenizer.EOS_ID,
    "unk_token": Keys.Tokenizer.UNK_ID,
    "pad_token": Keys.Tokenizer.PAD_ID,
}
# Stop ids beside EOS: the end of a turn, and Llama 3's end of a tool-calling message.
END_OF_TURN_IDS = (Keys.Tokenizer.EOT_ID, Keys.Tokenizer.EOM_ID)


def gguf_tokenizer(path: Path) -> Tokenizer:
    """The tokenizer and chat template of the GGUF file ``path``."""
    reader = open_gguf(path)
    kind = metadata(reader, Keys.Tokenizer.MODEL)
    if kind != BYTE_LEVEL_BPE:
        raise CheckpointError(
            f"{path}: GGUF tokenizer {kind!r} is not supported (supported: {BYTE_LEVEL_BPE!r}, "
            "byte-level BPE)"
        )
    merges = metadata(reader, Keys.Tokenizer.MERGES)
    if merges is None:
        raise CheckpointError(f"{path}: GGUF byte-level BPE tokenizer has no merges")
    tokens = _byte_level_spelling(metadata(reader, Keys.Tokenizer.LIST))
    special_tokens = {
        name: tokens[token_id]
        for name, key in SPECIAL_TOKEN_IDS.items()
        if (token_id := metadata(reader, key)) is not None
    }
    backend = Backend(
        models.BPE(
            vocab={token: i for i, token in enumerate(tokens)},
            merges=[tuple(merge.split(" ")) for merge in merges],
            fuse_unk=False,
        )
    )
    backend.pre_tokenizer = _pre_tokenizer(path, metadata(reader, Keys.Tokenizer.PRE, "default"))
    backend.decoder = decoders.ByteLevel()
    _add_special_tokens(backend, reader, tokens, special_tokens.values())
    if (post_processor := _post_processor(backend, reader, special_tokens)) is not None:
        backend.post_processor = post_processor
    return Tokenizer(
        backend,
        special_tokens,
        chat_template=metadata(reader, Keys.Tokenizer.CHAT_TEMPLATE),
        generation_eos_token_ids=[
            token_id for key in END_OF_TURN_IDS if (token_id := metadata(reader, key)) is not None
        ],
    )


def _byte_alphabet() -> dict[int, str]:
    # GPT-2's spelling of bytes: printable ones stand for themselves, the others for U+0100 on.
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = (b for b in range(256) if b not in printable)
    return {b: chr(b) for b in printable} | {b: chr(0x100 + i) for i, b in enumerate(others)}


def _byte_level_spelling(tokens: list[str]) -> list[str]:
    # Every token of a byte-level vocabulary is spelled in the byte alphabet; one that is not
    # (llama.cpp writes some special tokens as plain text) is respelled, as transformers does.
    spelling = _byte_alphabet()
    alphabet = set(spelling.values())
    return [
        t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8")) for t in tokens
    ]


def _pre_tokenizer(path: Path, pre: str) -> pre_tokenizers.PreTokenizer:
    split = PRE_TOKENIZER_SPLITS.get(pre)
    if split is None:
        raise CheckpointError(
            f"{path}: GGUF pre-tokenizer {pre!r} is not supported "
            f"(supported: {', '.join(PRE_TOKENIZER_SPLITS)})"
        )
    if split == GPT2_SPLIT:
        return pre_tokenizers.ByteLevel(add_prefix_space=False)
    if split == DIGITS_THEN_GPT2:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False),
            ]
        )
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def _add_special_tokens(
    backend: Backend, reader: GGUFReader, tokens: list[str], named: Iterable[str]
) -> None:
    """Control tokens (``<|im_end|>``) and the named ones match whole and are special; user-defined
    ones (``<think>``) match whole but are text."""
    types = metadata(reader, Keys.Tokenizer.TOKEN_TYPE) or []
    control = {t for t, kind in zip(tokens, types, strict=False) if kind == TokenType.CONTROL}
    backend.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in sorted(control | set(named))]
    )
    backend.add_tokens(
        [
            AddedToken(t, special=False, normalized=False)
            for t, kind in zip(tokens, types, strict=False)
            if kind == TokenType.USER_DEFINED
        ]
    )


def _post_processor(
    backend: Backend, reader: GGUFReader, special_tokens: dict[str, str]
) -> processors.PostProcessor | None:
    """BOS before and EOS after every sequence where the file says so (byte-level files default to
    neither), in the template transformers writes."""
    bos, eos = special_tokens.get("bos_token"), special_tokens.get("eos_token")
    add_bos = bos is not None and metadata(reader, Keys.Tokenizer.ADD_BOS, False)
    add_eos = eos is not None and metadata(reader, Keys.Tokenizer.ADD_EOS, False)
    if not (add_bos or add_eos):
        return None

    def sequence(name: str, type_id: int) -> list[str]:
        return [
            *([f"{bos}:{type_id}"] if add_bos else []),
            f"{name}:{type_id}",
            *([f"{eos}:{type_id}"] if add_eos else []),
        ]

    added = [t for t, on in ((bos, add_bos), (eos, add_eos)) if on]
    return processors.TemplateProcessing(
        single=sequence("$A", 0),
        pair=sequence("$A", 0) + sequence("$B", 1),
        special_tokens=[(t, backend.token_to_id(t)) for t in added],
    )
