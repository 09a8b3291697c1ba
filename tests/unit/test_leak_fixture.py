"""The conftest leak check can fail: an idle engine holding a block is reported, not a busy one."""

from collections.abc import Callable
from pathlib import Path

import pytest

from pdserve import LLM, SamplingParams
from pdserve.engine.llm_engine import LLMEngine


def test_leak_check_catches_a_held_block(
    tiny_model_dir: Path, assert_no_leaks: Callable[[LLMEngine], None]
) -> None:
    engine = LLM(model=tiny_model_dir, num_kv_blocks=8).engine
    assert_no_leaks(engine)
    blocks = engine.block_pool.allocate(1)
    try:
        with pytest.raises(AssertionError, match="7 of 8 free"):
            assert_no_leaks(engine)
    finally:
        # Give it back, or the autouse check would (rightly) fail this test at teardown.
        engine.block_pool.free(blocks)
    assert_no_leaks(engine)


def test_leak_check_skips_an_engine_with_unfinished_requests(
    tiny_model_dir: Path, assert_no_leaks: Callable[[LLMEngine], None]
) -> None:
    engine = LLM(model=tiny_model_dir, num_kv_blocks=8).engine
    engine.add_request("busy", [1, 2, 3], SamplingParams(max_tokens=4))
    engine.step()  # admitted: it holds blocks, legitimately
    assert engine.block_pool.num_free_blocks < engine.block_pool.num_blocks
    assert_no_leaks(engine)
    engine.abort_request("busy")
    assert_no_leaks(engine)
