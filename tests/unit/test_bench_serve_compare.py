"""``bench serve --compare``: b's summary figures over a's, run by run; and how a streamed chunk's
tokens are counted, which every figure rests on."""

import json
from pathlib import Path

from pdserve.benchmarks.openai_http import chunk_tokens
from pdserve.benchmarks.serve_bench.compare import compare_files, compare_table, load_pair


def _result(label: str, **summary: object) -> dict:
    return {
        "model": "m",
        "backend": "http x",
        "dataset": "random",
        "runs": [{"label": label, "summary": summary}],
    }


def test_the_table_is_b_over_a_for_the_numbers_both_hold() -> None:
    a = _result("rate 2", completed=10, mean_ttft_ms=50.0, goodput=None, errors={}, only_a=1.0)
    b = _result("rate 2", completed=10, mean_ttft_ms=75.0, goodput=None, errors={"x": 1})
    rows = compare_table(a, b)
    assert rows[2:] == [
        "| rate 2 | completed | 10 | 10 | 1.000x |",
        "| rate 2 | mean_ttft_ms | 50.00 | 75.00 | 1.500x |",
    ]
    zero = compare_table(_result("r", failed=0), _result("r", failed=3))
    assert zero[2:] == ["| r | failed | 0 | 3 | - |"]  # no ratio over zero


def test_runs_pair_in_order_and_differing_labels_show(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_result("rate 1", completed=4)))
    second = _result("rate 2", completed=2)
    second["runs"].append({"label": "rate 4", "summary": {"completed": 1}})
    b.write_text(json.dumps(second))
    lines = compare_files(a, b, load_pair(a, b))
    assert lines[0] == f"a: {a} (m over http x, dataset random)"
    assert "runs: 1 in a, 2 in b" in lines[2]
    assert lines[-1] == "| rate 1 vs rate 2 | completed | 4 | 2 | 0.500x |"


def test_the_pair_is_named_by_its_files_and_told_apart_when_they_share_a_name(
    tmp_path: Path,
) -> None:
    a, b = tmp_path / "agg.json", tmp_path / "disagg.json"
    a.write_text(json.dumps(_result("rate 1", completed=4)))
    b.write_text(json.dumps(_result("rate 1", completed=2)))
    assert list(load_pair(a, b)) == ["agg", "disagg"]
    (tmp_path / "other").mkdir()
    twin = tmp_path / "other" / "agg.json"
    twin.write_text(b.read_text())
    pair = load_pair(a, twin)  # one series each in the plots, not one merged into the other
    assert list(pair) == ["a agg", "b agg"]
    assert [r["runs"][0]["summary"]["completed"] for r in pair.values()] == [4, 2]


def test_a_chunk_counts_its_logprob_entries_or_one_for_bare_text() -> None:
    completion = {"text": "ab", "logprobs": {"tokens": ["token_id:5", "token_id:6"]}}
    chat = {"delta": {"content": "abc"}, "logprobs": {"content": [{}, {}, {}]}}
    assert chunk_tokens(completion) == 2 and chunk_tokens(chat) == 3
    assert chunk_tokens({"text": "ab", "logprobs": None}) == 1  # a server without logprobs
    assert chunk_tokens({"delta": {"content": "x"}}) == 1
    assert chunk_tokens({"text": "", "finish_reason": "length"}) == 0
    assert chunk_tokens({"delta": {}, "finish_reason": "length"}) == 0
