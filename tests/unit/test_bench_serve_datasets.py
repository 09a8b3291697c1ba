"""``bench serve``'s datasets on the tiny model's tokenizer: the lengths asked for, prompts whose
text encodes back to exactly the tokens drawn, tenants' shared prefixes, the shipped chat set, and
the same requests for the same seed."""

import json
import random
from collections import Counter
from pathlib import Path

import pytest

from pdserve.benchmarks.serve_bench.datasets import (
    CHAT_FILE,
    PromptShape,
    lengths,
    make_requests,
    word_pool,
)
from pdserve.engine.tokenizer import Tokenizer

SHAPE = PromptShape(
    input_len=40, output_len=16, range_ratio=0.0, num_tenants=3, prefix_len=48, suffix_len=8
)
COUNT = 30
BOS = 1  # the tiny tokenizer adds one to a text prompt


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_pretrained(tiny_model_dir)


def test_random_prompts_are_the_lengths_drawn_and_encode_back(tokenizer: Tokenizer) -> None:
    requests = make_requests("random", tokenizer, SHAPE, COUNT, seed=0, chat=False)
    assert len(requests) == COUNT and len({r.prompt for r in requests}) == COUNT
    for request in requests:
        assert request.prompt_len == SHAPE.input_len + BOS == len(tokenizer.encode(request.prompt))
        assert request.output_len == SHAPE.output_len
        ids = tokenizer.encode(request.prompt, add_special_tokens=False)
        assert tokenizer.encode(tokenizer.decode(ids), add_special_tokens=False) == ids


def test_a_range_ratio_spreads_lengths_as_vllm_does(tokenizer: Tokenizer) -> None:
    shape = SHAPE._replace(range_ratio=0.5)
    requests = make_requests("random", tokenizer, shape, COUNT, seed=0, chat=False)
    inputs = [r.prompt_len - BOS for r in requests]
    outputs = [r.output_len for r in requests]
    assert min(inputs) >= 20 and max(inputs) <= 60 and len(set(inputs)) > 1  # 40 * [0.5, 1.5]
    assert min(outputs) >= 8 and max(outputs) <= 24 and len(set(outputs)) > 1
    with pytest.raises(ValueError, match="range_ratio"):
        lengths(random.Random(0), 10, 1.0, 1)


def test_same_seed_same_requests_and_another_seed_others(tokenizer: Tokenizer) -> None:
    for name in ("random", "prefix-shared", "chat"):
        first = make_requests(name, tokenizer, SHAPE, COUNT, seed=3, chat=False)
        assert first == make_requests(name, tokenizer, SHAPE, COUNT, seed=3, chat=False)
        assert first != make_requests(name, tokenizer, SHAPE, COUNT, seed=4, chat=False)


def test_prefix_shared_prompts_share_their_tenants_prefix(tokenizer: Tokenizer) -> None:
    requests = make_requests("prefix-shared", tokenizer, SHAPE, COUNT, seed=0, chat=False)
    ids = [tokenizer.encode(r.prompt, add_special_tokens=False) for r in requests]
    assert all(len(i) == SHAPE.prefix_len + SHAPE.suffix_len for i in ids)
    tenants = Counter(tuple(i[: SHAPE.prefix_len]) for i in ids)
    assert sorted(tenants.values()) == [COUNT // SHAPE.num_tenants] * SHAPE.num_tenants
    assert len({tuple(i[SHAPE.prefix_len :]) for i in ids}) == COUNT  # each its own suffix
    assert [r.prompt_len for r in requests] == [SHAPE.prefix_len + SHAPE.suffix_len + BOS] * COUNT


def test_the_chat_set_ships_its_prompts_and_output_lengths(tokenizer: Tokenizer) -> None:
    rows = [json.loads(line) for line in CHAT_FILE.read_text().splitlines()]
    assert len(rows) >= 100 and all(r["prompt"] and r["output_len"] > 0 for r in rows)
    wanted = {r["prompt"]: r["output_len"] for r in rows}
    requests = make_requests("chat", tokenizer, SHAPE, len(rows) + 5, seed=0, chat=True)
    assert len({r.prompt for r in requests}) == len(rows)  # every row, then round again
    for request in requests:
        assert request.output_len == wanted[request.prompt]
        # as a user message through the chat template: more tokens than the bare text
        assert request.prompt_len > len(tokenizer.encode(request.prompt))


def test_the_word_pool_holds_only_words_that_encode_back(tokenizer: Tokenizer) -> None:
    pool = word_pool(tokenizer)
    assert len(pool.ids) > SHAPE.input_len
    for token in pool.ids:
        text = tokenizer.decode([token])
        assert text[0] == " " and text[1:].isalpha()
        assert tokenizer.encode(text, add_special_tokens=False) == [token]
    assert not set(pool.ids) & set(tokenizer.all_special_ids)
