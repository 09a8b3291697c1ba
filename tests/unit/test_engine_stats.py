"""Per-request timings and engine counters, as the metrics layer will read them."""

from pathlib import Path

import pytest

from pdserve import LLM, SamplingParams
from pdserve.engine.config import EngineConfig
from pdserve.engine.llm_engine import LLMEngine
from pdserve.engine.stats import IterationStats


def test_timings_and_counters(tiny_model_dir: Path) -> None:
    llm = LLM(model=tiny_model_dir, num_kv_blocks=64)
    prompts = [[5] * 40, [5] * 40 + [9] * 8]  # the second shares two full blocks with the first
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    first = llm.generate(prompts[0], params)[0]
    second = llm.generate(prompts[1], params)[0]
    for output in (first, second):
        m = output.metrics
        assert m is not None and len(m.token_times) == len(output.token_ids) == 6
        assert m.arrival_time <= m.first_token_time == m.token_times[0] <= m.finished_time
        assert list(m.token_times) == sorted(m.token_times)
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens == second.metrics.num_cached_tokens == 32
    stats = llm.engine.stats()
    assert stats.num_running == stats.num_waiting == 0
    assert stats.kv_cache_usage == 0.0 and stats.num_free_blocks == 64
    assert stats.prefix_cache_queries == 40 + 48 and stats.prefix_cache_hits == 32
    assert stats.num_preemptions == 0


def _run_to_end(engine: LLMEngine) -> None:
    while engine.has_unfinished_requests():
        engine.step()


def test_iteration_stats_count_each_token_once(tiny_model_dir: Path) -> None:
    engine = LLMEngine(EngineConfig(model=str(tiny_model_dir), num_kv_blocks=64), True)
    lengths, max_tokens = [40, 7, 19], [6, 3, 1]
    for i, (n, m) in enumerate(zip(lengths, max_tokens, strict=True)):
        params = SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True)
        engine.add_request(f"r{i}", [100 + i] * n, params)
    engine.add_request("gone", [7] * 9, SamplingParams(max_tokens=5, ignore_eos=True))
    engine.step()
    engine.abort_request("gone")
    _run_to_end(engine)
    stats = engine.take_iteration_stats()
    assert stats.num_prompt_tokens == sum(lengths) + 9
    # The aborted request sampled its first token in the first step, with the others.
    assert stats.num_generation_tokens == sum(max_tokens) + 1
    # Every prompt token runs once, and every sampled token but each request's last.
    assert sum(stats.iteration_tokens) == sum(lengths) + 9 + sum(m - 1 for m in max_tokens)
    finished = {f.num_prompt_tokens: f for f in stats.finished}
    assert sorted(finished) == sorted([*lengths, 9])
    assert finished[9].finish_reason == "abort" and finished[9].num_generation_tokens == 1
    for n, m in zip(lengths, max_tokens, strict=True):
        f = finished[n]
        assert (f.finish_reason, f.num_generation_tokens) == ("length", m)
        assert min(f.queue_time, f.prefill_time, f.decode_time) >= 0
        assert f.e2e_time == pytest.approx(f.queue_time + f.prefill_time + f.decode_time)
    assert engine.take_iteration_stats() == IterationStats()  # taken: a new count begins


def test_a_remote_prefill_counts_only_what_this_engine_samples(tiny_model_dir: Path) -> None:
    engine = LLMEngine(EngineConfig(model=str(tiny_model_dir), num_kv_blocks=64), True)
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    assert engine.add_remote_prefilled("remote", [3] * 20, params) is not None
    engine.complete_remote_prefill("remote", first_token=11)  # the peer's token, not ours
    _run_to_end(engine)
    stats = engine.take_iteration_stats()
    assert (stats.num_prompt_tokens, stats.num_generation_tokens) == (0, 3)
    assert [f.num_generation_tokens for f in stats.finished] == [4]


def test_without_collect_stats_nothing_is_kept(tiny_model_dir: Path) -> None:
    engine = LLMEngine(EngineConfig(model=str(tiny_model_dir), num_kv_blocks=64))
    engine.add_request("r", [1, 2, 3], SamplingParams(max_tokens=2))
    _run_to_end(engine)
    with pytest.raises(RuntimeError, match="collect_stats"):
        engine.take_iteration_stats()
