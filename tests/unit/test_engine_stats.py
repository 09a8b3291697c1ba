"""Per-request timings and engine counters, as the metrics layer will read them."""

from pathlib import Path

from pdserve import LLM, SamplingParams


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
