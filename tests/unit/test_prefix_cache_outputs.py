"""The prefix cache serves exactly the full blocks it holds, counts them, and changes no output.

Outputs from a caching engine are compared with a fresh engine that has prefix caching off (and,
for the shared-prefix case, with transformers). Greedy decoding, so any KV served from a wrong
or stale block shows as different tokens.
"""

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from pdserve import LLM, SamplingParams
from pdserve.engine.config import EngineConfig, ModelConfig
from pdserve.engine.llm_engine import LLMEngine
from pdserve.engine.prefix_hash import extend_block_hashes
from pdserve.tests.hf_reference import hf_greedy

BLOCK_SIZE = 16
NUM_OUTPUT_TOKENS = 16
SHARED_PREFIX_LEN = 256  # 16 full blocks
AMPLE_BLOCKS = 256
SEED = 0
# Eviction: every prompt is a 2-block common prefix + 4 unique blocks, and generates 1 more block.
# 4 "early" prompts, then 10 "late" ones (50 unique blocks) through a 40-block cache.
PRESSURE_BLOCKS = 40
COMMON_PREFIX_LEN = 2 * BLOCK_SIZE
UNIQUE_LEN = 4 * BLOCK_SIZE
NUM_EARLY, NUM_LATE = 4, 10


def _full_block_hit(prompt_len: int) -> int:
    """Tokens a fully cached prompt is served: whole blocks, never the last prompt token."""
    return (prompt_len - 1) // BLOCK_SIZE * BLOCK_SIZE


@pytest.fixture(scope="module")
def vocab_size(tiny_model_dir: Path) -> int:
    return ModelConfig.from_pretrained(tiny_model_dir).vocab_size


@pytest.fixture
def random_tokens(vocab_size: int) -> Callable[[int], list[int]]:
    g = torch.Generator().manual_seed(SEED)
    return lambda n: torch.randint(0, vocab_size, (n,), generator=g).tolist()


@pytest.fixture(scope="module")
def no_cache_llm(tiny_model_dir: Path) -> LLM:
    """The expected outputs: the same engine with nothing ever served from a cache."""
    return LLM(
        model=tiny_model_dir,
        block_size=BLOCK_SIZE,
        num_kv_blocks=AMPLE_BLOCKS,
        enable_prefix_caching=False,
    )


def _params() -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=NUM_OUTPUT_TOKENS, ignore_eos=True)


def _expected(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    return [out.token_ids for out in llm.generate(prompts, _params())]


def test_shared_prefix_is_served_from_cache(
    tiny_model_dir: Path,
    no_cache_llm: LLM,
    random_tokens: Callable[[int], list[int]],
    assert_no_leaks: Callable[[LLMEngine], None],
) -> None:
    prefix = random_tokens(SHARED_PREFIX_LEN)
    prompt_a = prefix + random_tokens(30)
    suffix_b = random_tokens(57)
    while suffix_b[0] == prompt_a[SHARED_PREFIX_LEN]:  # B must leave A's path at token 256
        suffix_b = random_tokens(57)
    prompt_b = prefix + suffix_b
    llm = LLM(model=tiny_model_dir, block_size=BLOCK_SIZE, num_kv_blocks=AMPLE_BLOCKS)

    out_a = llm.generate([prompt_a], _params())[0]
    assert out_a.num_cached_tokens == 0
    before = llm.engine.stats()
    out_b = llm.generate([prompt_b], _params())[0]
    after = llm.engine.stats()

    assert out_b.num_cached_tokens == SHARED_PREFIX_LEN
    assert after.prefix_cache_hits - before.prefix_cache_hits == SHARED_PREFIX_LEN
    assert after.prefix_cache_hits <= after.prefix_cache_queries
    assert out_a.token_ids == _expected(no_cache_llm, [prompt_a])[0]
    assert out_b.token_ids == _expected(no_cache_llm, [prompt_b])[0]
    assert out_b.token_ids == hf_greedy(tiny_model_dir, [(prompt_b, NUM_OUTPUT_TOKENS)])[0]
    assert_no_leaks(llm.engine)


# 1 and 16: no full block before the last token; 128: the last block is full but holds the last
# prompt token, so it is recomputed.
@pytest.mark.parametrize("prompt_len", [1, 16, 17, 100, 128])
def test_repeated_prompt_recomputes_only_the_last_token(
    tiny_model_dir: Path,
    no_cache_llm: LLM,
    random_tokens: Callable[[int], list[int]],
    assert_no_leaks: Callable[[LLMEngine], None],
    prompt_len: int,
) -> None:
    prompt = random_tokens(prompt_len)
    llm = LLM(model=tiny_model_dir, block_size=BLOCK_SIZE, num_kv_blocks=AMPLE_BLOCKS)
    first = llm.generate([prompt], _params())[0]
    hits_before = llm.engine.stats().prefix_cache_hits
    second = llm.generate([prompt], _params())[0]

    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens == _full_block_hit(prompt_len)
    assert llm.engine.stats().prefix_cache_hits - hits_before == _full_block_hit(prompt_len)
    assert first.token_ids == second.token_ids == _expected(no_cache_llm, [prompt])[0]
    assert_no_leaks(llm.engine)


def test_eviction_under_pressure_keeps_outputs(
    tiny_model_dir: Path,
    no_cache_llm: LLM,
    random_tokens: Callable[[int], list[int]],
    assert_no_leaks: Callable[[LLMEngine], None],
) -> None:
    common = random_tokens(COMMON_PREFIX_LEN)
    early = [common + random_tokens(UNIQUE_LEN) for _ in range(NUM_EARLY)]
    late = [common + random_tokens(UNIQUE_LEN) for _ in range(NUM_LATE)]
    full_hit = _full_block_hit(COMMON_PREFIX_LEN + UNIQUE_LEN)
    llm = LLM(model=tiny_model_dir, block_size=BLOCK_SIZE, num_kv_blocks=PRESSURE_BLOCKS)

    first_pass = llm.generate(early, _params())  # 22 blocks: they all fit at once
    assert_no_leaks(llm.engine)
    # One at a time, so nothing is preempted and each request's cache lookup happens once: the
    # late prompts' 50 unique blocks must evict and reuse blocks that held early prompts.
    late_outputs = [llm.generate([prompt], _params())[0] for prompt in late]
    assert_no_leaks(llm.engine)
    # The last late prompt goes first, so its lookup precedes the early prompts' allocations.
    again = llm.generate([late[-1], *early], _params())
    assert_no_leaks(llm.engine)

    expected_early, expected_late = _expected(no_cache_llm, early), _expected(no_cache_llm, late)
    assert [out.token_ids for out in first_pass] == expected_early
    assert [out.token_ids for out in late_outputs] == expected_late
    assert [out.token_ids for out in again] == [expected_late[-1], *expected_early]

    rerun_last, rerun_early = again[0], again[1:]
    # Least recently used first: the common prefix (used by every request) survives, most of the
    # early prompts' own blocks do not; the last late prompt was just run, so it is all cached.
    assert all(COMMON_PREFIX_LEN <= out.num_cached_tokens <= full_hit for out in rerun_early)
    assert sum(out.num_cached_tokens for out in rerun_early) < NUM_EARLY * full_hit
    assert rerun_last.num_cached_tokens == full_hit
    # Hits are counted where blocks were served, nowhere else.
    stats = llm.engine.stats()
    assert stats.num_preemptions == 0
    served = sum(out.num_cached_tokens for out in [*first_pass, *late_outputs, *again])
    assert stats.prefix_cache_hits == served
    assert stats.prefix_cache_hits <= stats.prefix_cache_queries


def test_cache_salt_separates_tenants(
    tiny_model_dir: Path, random_tokens: Callable[[int], list[int]]
) -> None:
    """The same prompt under another cache_salt shares no cached block; under the same, it does."""
    config = EngineConfig(
        model=str(tiny_model_dir), num_kv_blocks=AMPLE_BLOCKS, block_size=BLOCK_SIZE
    )
    engine = LLMEngine(config)
    prompt = random_tokens(100)

    def cached_tokens(request_id: str, salt: str) -> int:
        engine.add_request(request_id, prompt, _params(), cache_salt=salt)
        finals = []
        while engine.has_unfinished_requests():
            finals += [delta for delta in engine.step() if delta.finished]
        return finals[0].num_cached_tokens

    assert cached_tokens("a", "tenant-a") == 0
    assert cached_tokens("b", "tenant-b") == 0
    assert cached_tokens("c", "tenant-a") == _full_block_hit(len(prompt))


def test_reset_prefix_cache_is_refused_while_busy_and_then_forgets(
    tiny_model_dir: Path,
    random_tokens: Callable[[int], list[int]],
    assert_no_leaks: Callable[[LLMEngine], None],
) -> None:
    prompt = random_tokens(100)
    llm = LLM(model=tiny_model_dir, block_size=BLOCK_SIZE, num_kv_blocks=AMPLE_BLOCKS)
    first = llm.generate([prompt], _params())[0]
    engine = llm.engine
    engine.add_request("busy", random_tokens(20), _params())
    engine.step()
    assert not llm.reset_prefix_cache()  # a running request holds blocks
    engine.abort_request("busy")
    hashes: list[bytes] = []
    extend_block_hashes(hashes, prompt, BLOCK_SIZE)
    assert engine.block_pool.lookup(hashes, len(hashes))
    assert llm.reset_prefix_cache()
    assert not engine.block_pool.lookup(hashes, len(hashes))
    again = llm.generate([prompt], _params())[0]
    assert again.num_cached_tokens == 0
    assert again.token_ids == first.token_ids
    assert_no_leaks(engine)
