"""The benchmark's prompts: ``random`` (input/output lengths uniform around a mean, as vLLM's random
dataset), ``prefix-shared`` (tenants whose requests share a prefix, for the prefix cache) and
``chat`` (a shipped set of chat-like prompts with target output lengths).

Random prompts are drawn from the tokenizer's word tokens (a space and letters, each of which
the tokenizer encodes back to itself), so their text encodes back to exactly the ids drawn: the
server prefills the lengths asked for, over any API, text or token ids.
"""

import functools
import json
import math
import random
from pathlib import Path
from typing import NamedTuple

from pdserve.engine.tokenizer import Tokenizer

CHAT_FILE = Path(__file__).with_name("data") / "chat.jsonl"
DATASETS = ("random", "prefix-shared", "chat")
MIN_WORDS = 100  # fewer word tokens than this: random prompts would repeat themselves too much
MAX_DRAWS = 8  # redraws of a prompt whose text does not encode back to its ids


class BenchRequest(NamedTuple):
    prompt: str  # the text sent (as the user message on chat completions)
    prompt_len: int  # tokens the server prefills for it: BOS, or the chat template, included
    output_len: int  # max_tokens


class PromptShape(NamedTuple):
    """Lengths in tokens (``range_ratio``: uniform in mean * [1 - r, 1 + r], as vLLM's)."""

    input_len: int
    output_len: int
    range_ratio: float
    num_tenants: int  # prefix-shared: tenants, each with its own prefix
    prefix_len: int
    suffix_len: int  # prefix-shared: each request's own tokens after its tenant's prefix


def prompt_tokens(tokenizer: Tokenizer, text: str, chat: bool) -> int:
    """The tokens a server prefills for ``text``: as a user message through the chat template, or
    encoded with the special tokens (BOS) the tokenizer adds."""
    if chat and tokenizer.chat_template is not None:
        return len(
            tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=True)
        )
    return len(tokenizer.encode(text))


class WordPool:
    """The tokenizer's word tokens; any sequence of them decodes to text that encodes back to it
    (byte-level BPE pre-tokenizes at each space, so no merge crosses two words)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        special = set(tokenizer.all_special_ids)
        ids = [i for i in range(tokenizer.vocab_size) if i not in special]
        texts = tokenizer.backend.decode_batch([[i] for i in ids])
        encoded = tokenizer.backend.encode_batch(texts, add_special_tokens=False)
        self.ids = [
            i
            for i, text, enc in zip(ids, texts, encoded, strict=True)
            if text[:1] == " " and text[1:].isalpha() and enc.ids == [i]
        ]
        if len(self.ids) < MIN_WORDS:
            raise ValueError(
                f"the tokenizer has {len(self.ids)} word tokens (a space and letters that encode "
                f"back to themselves), fewer than {MIN_WORDS}: not a byte-level BPE tokenizer?"
            )

    def text(self, rng: random.Random, num_tokens: int, prefix: str = "") -> str:
        """``prefix`` and then ``num_tokens`` random words, as text that encodes back to them."""
        for _ in range(MAX_DRAWS):
            ids = self.tokenizer.encode(prefix, add_special_tokens=False) if prefix else []
            ids += rng.choices(self.ids, k=num_tokens)
            text = self.tokenizer.decode(ids)
            if self.tokenizer.encode(text, add_special_tokens=False) == ids:
                return text
        raise RuntimeError(f"no {num_tokens}-token text that encodes back in {MAX_DRAWS} draws")


@functools.cache
def word_pool(tokenizer: Tokenizer) -> WordPool:
    """The tokenizer's pool, built once (it decodes the whole vocabulary)."""
    return WordPool(tokenizer)


def lengths(rng: random.Random, mean: int, range_ratio: float, count: int) -> list[int]:
    """``count`` lengths uniform over mean * [1 - r, 1 + r] (at least 1), as vLLM's."""
    if not 0 <= range_ratio < 1:
        raise ValueError(f"range_ratio must be in [0, 1), got {range_ratio}")
    low = max(1, math.floor(mean * (1 - range_ratio)))
    high = max(low, math.ceil(mean * (1 + range_ratio)))
    return [rng.randint(low, high) for _ in range(count)]


def random_requests(
    tokenizer: Tokenizer, shape: PromptShape, count: int, seed: int, chat: bool
) -> list[BenchRequest]:
    rng, pool = random.Random(seed), word_pool(tokenizer)
    inputs = lengths(rng, shape.input_len, shape.range_ratio, count)
    outputs = lengths(rng, shape.output_len, shape.range_ratio, count)
    texts = [pool.text(rng, n) for n in inputs]
    return [
        BenchRequest(text, prompt_tokens(tokenizer, text, chat), out)
        for text, out in zip(texts, outputs, strict=True)
    ]


def prefix_shared_requests(
    tokenizer: Tokenizer, shape: PromptShape, count: int, seed: int, chat: bool
) -> list[BenchRequest]:
    """Request i goes to tenant i mod ``num_tenants`` (then all are shuffled): its tenant's prefix
    of ``prefix_len`` tokens, then ``suffix_len`` tokens of its own."""
    rng, pool = random.Random(seed), word_pool(tokenizer)
    prefixes = [pool.text(rng, shape.prefix_len) for _ in range(shape.num_tenants)]
    outputs = lengths(rng, shape.output_len, shape.range_ratio, count)
    texts = [
        pool.text(rng, shape.suffix_len, prefixes[i % shape.num_tenants]) for i in range(count)
    ]
    rng.shuffle(texts)
    return [
        BenchRequest(text, prompt_tokens(tokenizer, text, chat), out)
        for text, out in zip(texts, outputs, strict=True)
    ]


def chat_requests(tokenizer: Tokenizer, count: int, seed: int, chat: bool) -> list[BenchRequest]:
    """``count`` prompts of the shipped chat set, shuffled, cycling through it if it is short."""
    rows = [json.loads(line) for line in CHAT_FILE.read_text(encoding="utf-8").splitlines()]
    random.Random(seed).shuffle(rows)
    picked = [rows[i % len(rows)] for i in range(count)]
    return [
        BenchRequest(
            row["prompt"], prompt_tokens(tokenizer, row["prompt"], chat), row["output_len"]
        )
        for row in picked
    ]


def make_requests(
    name: str, tokenizer: Tokenizer, shape: PromptShape, count: int, seed: int, chat: bool
) -> list[BenchRequest]:
    """``count`` requests of dataset ``name`` (one of ``DATASETS``), the same for the same seed."""
    if name == "random":
        return random_requests(tokenizer, shape, count, seed, chat)
    if name == "prefix-shared":
        return prefix_shared_requests(tokenizer, shape, count, seed, chat)
    if name == "chat":
        return chat_requests(tokenizer, count, seed, chat)
    raise ValueError(f"unknown dataset {name!r}; choose one of: {', '.join(DATASETS)}")
