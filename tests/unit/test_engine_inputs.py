"""The engine refuses bad input with a message naming the problem, and keeps serving afterwards."""

import json
import shutil
from pathlib import Path

import pytest

from pdserve import LLM, SamplingParams
from pdserve.engine.config import ModelConfig
from pdserve.engine.errors import ContextLengthError, RequestError


@pytest.fixture(scope="module")
def llm(tiny_model_dir: Path) -> LLM:
    return LLM(model=tiny_model_dir, num_kv_blocks=256)


def _all_blocks_free(llm: LLM) -> bool:
    pool = llm.engine.block_pool
    return pool.num_free_blocks == pool.num_blocks


@pytest.mark.parametrize(
    ("make_call", "error", "words"),
    [
        (lambda llm: llm.generate([""]), RequestError, "prompt is empty"),
        (lambda llm: llm.generate([[]]), RequestError, "prompt is empty"),
        (lambda llm: llm.generate([[1] * 5000]), ContextLengthError, "maximum context length"),
        (lambda llm: llm.generate([[10**6]]), RequestError, "outside the vocabulary"),
        (lambda llm: llm.generate(["hi"], SamplingParams(max_tokens=0)), ValueError, "max_tokens"),
        (lambda llm: SamplingParams(temperature=-1), ValueError, "temperature"),
        (lambda llm: SamplingParams(top_p=2), ValueError, "top_p"),
        (lambda llm: llm.generate(["a", "b"], [SamplingParams()]), ValueError, "sampling params"),
    ],
)
def test_bad_input_is_refused_clearly(llm: LLM, make_call, error, words: str) -> None:
    with pytest.raises(error, match=words):
        make_call(llm)
    assert _all_blocks_free(llm)
    assert not llm.engine.has_unfinished_requests()


def test_bad_prompt_in_a_batch_queues_nothing_and_engine_keeps_serving(llm: LLM) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=8)
    expected = llm.generate(["hello world"], params)[0].token_ids
    with pytest.raises(RequestError, match="prompt is empty"):
        llm.generate(["hello world", ""], params)
    assert not llm.engine.has_unfinished_requests()
    assert _all_blocks_free(llm)
    assert llm.generate(["hello world"], params)[0].token_ids == expected


def test_request_larger_than_the_cache_is_refused(tiny_model_dir: Path) -> None:
    small = LLM(model=tiny_model_dir, num_kv_blocks=4)  # 64 tokens of cache
    with pytest.raises(RequestError, match="KV blocks"):
        small.generate([[1] * 40], SamplingParams(max_tokens=40))
    assert small.generate([[1] * 40], SamplingParams(max_tokens=8))[0].finish_reason == "length"


def test_unsupported_model_type_and_missing_files_are_named(tmp_path: Path, tiny_model_dir: Path):
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        ModelConfig.from_pretrained(tmp_path)
    config = json.loads((tiny_model_dir / "config.json").read_text())
    with pytest.raises(ValueError, match="unsupported model_type 'gpt2'"):
        ModelConfig.from_dict({**config, "model_type": "gpt2"})
    shutil.copytree(tiny_model_dir, tmp_path / "m")
    (tmp_path / "m" / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"model\.safetensors"):
        LLM(model=tmp_path / "m")


def test_seeded_sampling_is_reproducible_and_seed_dependent(llm: LLM) -> None:
    def sample(seed: int) -> list[int]:
        params = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=24, seed=seed)
        return llm.generate(["the cache"], params)[0].token_ids

    first = sample(1234)
    assert sample(1234) == first
    assert sample(4321) != first
    # A seeded request's tokens do not depend on what else shares the batch.
    params = [SamplingParams(temperature=1.0, max_tokens=24, seed=s) for s in (1234, 99)]
    assert llm.generate(["the cache", "other prompt"], [params[0], params[1]])[0].token_ids == (
        llm.generate(["the cache"], params[0])[0].token_ids
    )


def test_stop_strings_and_n(llm: LLM) -> None:
    base = llm.generate(["abc"], SamplingParams(temperature=0.0, max_tokens=20))[0]
    stop = base.text[5:8]
    assert stop, "the greedy text is long enough to pick a stop string from"
    out = llm.generate(["abc"], SamplingParams(temperature=0.0, max_tokens=20, stop=[stop]))[0]
    assert out.finish_reason == "stop" and out.outputs[0].stop_reason == stop
    assert out.text == base.text[: base.text.index(stop)]
    many = llm.generate(["abc"], SamplingParams(n=3, temperature=1.0, max_tokens=8, seed=7))[0]
    assert [c.index for c in many.outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in many.outputs}) > 1
