"""Greedy output does not depend on how requests are batched, chunked, preempted or cached.

64 requests of random token ids (prompt lengths 1..512, output lengths 1..200) must produce exactly
the tokens transformers produces for each prompt run alone (as recorded: ``tiny_reference``),
whether the engine runs them one at a time, all at once, under a small or large token budget,
under a KV budget so small that requests are preempted and recomputed, or with the prefix cache
off.
"""

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from pdserve import LLM, SamplingParams
from pdserve.engine.llm_engine import LLMEngine
from pdserve.engine.outputs import RequestOutput
from pdserve.tests.hf_reference import hf_greedy
from pdserve.tests.tiny_reference import NUM_REQUESTS, Workload, batching_workload, recorded

pytestmark = pytest.mark.slow

BLOCK_SIZE = 16
MIN_PREEMPTIONS = 20
# Blocks beyond the largest single request: it fits alone; all 64 together need ~30 times more.
PREEMPTION_SPARE_BLOCKS = 3


def _blocks(num_tokens: int) -> int:
    return -(-num_tokens // BLOCK_SIZE)


@pytest.fixture(scope="module")
def workload(tiny_model_dir: Path) -> Workload:
    return batching_workload(tiny_model_dir)


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path, workload: Workload) -> list[list[int]]:
    """transformers' greedy tokens for each prompt run alone (batch of one, no padding), as
    recorded (``tiny_reference``)."""
    outputs = recorded(tiny_model_dir, workload)
    assert [len(o) for o in outputs] == [n for _, n in workload]
    return outputs


@pytest.mark.transformers_anew
def test_the_record_is_transformers_own(tiny_model_dir: Path, workload: Workload) -> None:
    made = hf_greedy(tiny_model_dir, workload)
    for i, (theirs, expected) in enumerate(
        zip(made, recorded(tiny_model_dir, workload), strict=True)
    ):
        assert theirs == expected, f"request {i}: transformers now says otherwise"


@pytest.fixture(scope="module")
def ample_blocks(workload: Workload) -> int:
    # Twice what all requests need at once: nothing is preempted, and a second pass over the
    # workload finds every prompt of the first still cached.
    return 2 * sum(_blocks(len(prompt) + n) for prompt, n in workload)


def _params(num_out: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=num_out, ignore_eos=True)


def _generate_all(llm: LLM, workload: Workload) -> list[RequestOutput]:
    return llm.generate([p for p, _ in workload], [_params(n) for _, n in workload])


def _assert_matches(
    outputs: Sequence[RequestOutput], reference: list[list[int]], workload: Workload, run: str
) -> None:
    """Every request's tokens equal the reference; the message lists where each diverged."""
    diverged = []
    for i, (out, expected, (prompt, _)) in enumerate(
        zip(outputs, reference, workload, strict=True)
    ):
        if out.token_ids != expected:
            # Lengths are checked too: a short output differs where it ends.
            pairs = zip(out.token_ids, expected, strict=False)
            at = next(
                (j for j, (a, b) in enumerate(pairs) if a != b),
                min(len(out.token_ids), len(expected)),
            )
            diverged.append(
                f"request {i} (prompt {len(prompt)}, output {len(expected)}): "
                f"{len(out.token_ids)} tokens, first difference at {at}"
            )
    if diverged:
        pytest.fail(
            f"{run}: {len(diverged)} of {len(outputs)} requests diverged:\n" + "\n".join(diverged)
        )


def test_each_request_alone(
    tiny_model_dir: Path,
    ample_blocks: int,
    workload: Workload,
    reference: list[list[int]],
    assert_no_leaks: Callable[[LLMEngine], None],
) -> None:
    llm = LLM(model=tiny_model_dir, block_size=BLOCK_SIZE, num_kv_blocks=ample_blocks)
    outputs = [llm.generate([prompt], _params(n))[0] for prompt, n in workload]
    _assert_matches(outputs, reference, workload, "one request per generate call")
    assert_no_leaks(llm.engine)


def test_all_in_one_call_cold_then_cached(
    tiny_model_dir: Path,
    ample_blocks: int,
    workload: Workload,
    reference: list[list[int]],
    assert_no_leaks: Callable[[LLMEngine], None],
) -> None:
    llm = LLM(model=tiny_model_dir, block_size=BLOCK_SIZE, num_kv_blocks=ample_blocks)
    first = _generate_all(llm, workload)
    _assert_matches(first, reference, workload, "all in one call")
    assert_no_leaks(llm.engine)
    # The same batch again: every prompt's full blocks are cached now, all but the last token's.
    second = _generate_all(llm, workload)
    _assert_matches(second, reference, workload, "all in one call, prompts cached")
    assert_no_leaks(llm.engine)
    cached = [out.num_cached_tokens for out in second]
    assert cached == [(len(p) - 1) // BLOCK_SIZE * BLOCK_SIZE for p, _ in workload]


@pytest.mark.parametrize("max_num_batched_tokens", [16, 64, 2048])
def test_token_budget(
    tiny_model_dir: Path,
    ample_blocks: int,
    workload: Workload,
    reference: list[list[int]],
    assert_no_leaks: Callable[[LLMEngine], None],
    max_num_batched_tokens: int,
) -> None:
    llm = LLM(
        model=tiny_model_dir,
        block_size=BLOCK_SIZE,
        num_kv_blocks=ample_blocks,
        max_num_batched_tokens=max_num_batched_tokens,
    )
    outputs = _generate_all(llm, workload)
    _assert_matches(outputs, reference, workload, f"budget {max_num_batched_tokens}")
    assert_no_leaks(llm.engine)


def test_preemption(
    tiny_model_dir: Path,
    workload: Workload,
    reference: list[list[int]],
    assert_no_leaks: Callable[[LLMEngine], None],
) -> None:
    # Room for the largest request and little more, while max_num_seqs (default 256) admits all
    # 64: decodes run out of blocks and the newest requests are preempted and recomputed.
    num_blocks = max(_blocks(len(p) + n) for p, n in workload) + PREEMPTION_SPARE_BLOCKS
    llm = LLM(model=tiny_model_dir, block_size=BLOCK_SIZE, num_kv_blocks=num_blocks)
    assert llm.engine.config.max_num_seqs >= NUM_REQUESTS
    outputs = _generate_all(llm, workload)
    _assert_matches(outputs, reference, workload, f"{num_blocks} KV blocks")
    assert_no_leaks(llm.engine)
    stats = llm.engine.stats()
    print(f"\n{num_blocks} KV blocks: {stats.num_preemptions} preemptions")
    assert stats.num_preemptions >= MIN_PREEMPTIONS
    assert (stats.num_running, stats.num_waiting, stats.kv_cache_usage) == (0, 0, 0.0)


def test_prefix_caching_off(
    tiny_model_dir: Path,
    ample_blocks: int,
    workload: Workload,
    reference: list[list[int]],
    assert_no_leaks: Callable[[LLMEngine], None],
) -> None:
    llm = LLM(
        model=tiny_model_dir,
        block_size=BLOCK_SIZE,
        num_kv_blocks=ample_blocks,
        enable_prefix_caching=False,
    )
    outputs = _generate_all(llm, workload)
    _assert_matches(outputs, reference, workload, "prefix caching off")
    assert all(out.num_cached_tokens == 0 for out in outputs)
    assert_no_leaks(llm.engine)
