"""The checkpoint's generation_config.json sets the sampling defaults of requests that leave them
out, as vLLM applies them: `generation_config: vllm` ignores the file, a folder names another,
`override_generation_config` wins over it; a request's own fields always win (no engine, no Ray:
a client that records the params it is given)."""

import asyncio
import json
import logging
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from pdserve.engine.config import EngineConfig
from pdserve.engine.errors import CheckpointError
from pdserve.engine.generation_config import GenerationDefaults, load_generation_defaults
from pdserve.engine.outputs import CompletionOutput, RequestOutput
from pdserve.engine.sampling_params import SamplingParams
from pdserve.engine.tokenizer import Tokenizer
from pdserve.router.api.engine_inputs import completion_budget
from pdserve.router.api.errors import APIError
from pdserve.router.api.grpc_service import GenerationServicer, pb
from pdserve.router.api.http_app import build_http_app

MODEL = "m"
MAX_MODEL_LEN = 64
# What Qwen2.5-Instruct's generation_config.json sets, and settings no server applies.
CHECKPOINT_DEFAULTS = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}
UNAPPLIED = {"do_sample": True, "typical_p": 0.9}
NEUTRAL = SamplingParams()


@pytest.fixture
def model_dir(tiny_model_dir: Path, tmp_path: Path) -> Path:
    """The tiny checkpoint's files, with sampling defaults in its generation_config.json."""
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    file = folder / "generation_config.json"
    raw = json.loads(file.read_text())
    file.write_text(json.dumps({**raw, **CHECKPOINT_DEFAULTS, **UNAPPLIED}))
    return folder


def _defaults(model: Path, **engine: Any) -> GenerationDefaults:
    return load_generation_defaults(EngineConfig(model=str(model), **engine))


class RecordingClient:
    """Answers each request with one token, keeping the params it was given."""

    model_name = MODEL
    max_model_len = MAX_MODEL_LEN

    def __init__(self, tokenizer: Tokenizer, generation_defaults: GenerationDefaults) -> None:
        self.tokenizer = tokenizer
        self.generation_defaults = generation_defaults
        self.params: list[SamplingParams] = []

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        priority: int = 0,
    ) -> AsyncIterator[RequestOutput]:
        self.params.append(params)
        done = CompletionOutput(0, "x", [1], finish_reason="length")
        yield RequestOutput(request_id, None, prompt_token_ids, [done], finished=True)

    async def check_health(self) -> None:
        pass


def _client(model: Path, **engine: Any) -> RecordingClient:
    return RecordingClient(Tokenizer.from_pretrained(model), _defaults(model, **engine))


def _params(client: RecordingClient, path: str, body: dict[str, Any]) -> SamplingParams:
    """The params the HTTP app gives the engine for ``body``."""
    with TestClient(build_http_app({MODEL: client})) as http:
        response = http.post(path, json=body)
    assert response.status_code == 200, response.text
    return client.params[-1]


COMPLETION = ("/v1/completions", {"prompt": "hello"})
CHAT = ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hello"}]})


@pytest.mark.parametrize(("path", "body"), [COMPLETION, CHAT])
def test_a_request_without_the_fields_gets_the_checkpoint_s(
    model_dir: Path, path: str, body: dict[str, Any]
) -> None:
    params = _params(_client(model_dir), path, body)
    assert {name: getattr(params, name) for name in CHECKPOINT_DEFAULTS} == CHECKPOINT_DEFAULTS
    assert params.min_p == NEUTRAL.min_p  # the file does not set it


@pytest.mark.parametrize(("path", "body"), [COMPLETION, CHAT])
def test_a_request_s_own_fields_win_and_an_explicit_zero_temperature_stays_greedy(
    model_dir: Path, path: str, body: dict[str, Any]
) -> None:
    own = {"temperature": 0, "top_p": 0.5, "top_k": -1, "repetition_penalty": 1.0}
    params = _params(_client(model_dir), path, {**body, **own})
    assert {name: getattr(params, name) for name in own} == own
    assert params.greedy


def test_the_grpc_servicer_applies_them_too(model_dir: Path) -> None:
    client = _client(model_dir)
    servicer = GenerationServicer({MODEL: client})
    request = pb.GenerateRequest(text="hello", sampling_params=pb.SamplingParams(top_p=0.5))
    asyncio.run(servicer.Complete(request, grpc_context=None))
    (params,) = client.params
    assert (params.temperature, params.top_p, params.top_k) == (0.7, 0.5, 20)


def test_vllm_ignores_the_file_and_a_checkpoint_without_one_has_no_defaults(
    model_dir: Path, tiny_model_dir: Path
) -> None:
    assert _defaults(model_dir, generation_config="vllm") == GenerationDefaults()
    assert _defaults(tiny_model_dir) == GenerationDefaults()  # token ids only
    (model_dir / "generation_config.json").unlink()
    assert _defaults(model_dir) == GenerationDefaults()
    params = _params(_client(model_dir), *CHAT)
    assert params == SamplingParams(max_tokens=params.max_tokens)


def test_the_override_wins_over_the_file_and_applies_without_one(model_dir: Path) -> None:
    override = {"temperature": 0.5, "min_p": 0.1}
    defaults = _defaults(model_dir, override_generation_config=override)
    assert defaults.sampling == {**CHECKPOINT_DEFAULTS, **override}
    alone = _defaults(model_dir, generation_config="vllm", override_generation_config=override)
    assert alone.sampling == override


def test_a_named_folder_s_file_is_read_and_a_folder_without_one_refused(
    model_dir: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    assert _defaults(tiny_model_dir, generation_config=str(model_dir)).sampling == (
        CHECKPOINT_DEFAULTS
    )
    with pytest.raises(CheckpointError, match="without the file"):
        _defaults(tiny_model_dir, generation_config=str(tmp_path))


def test_a_gguf_checkpoint_reads_the_file_beside_it(model_dir: Path, tmp_path: Path) -> None:
    gguf = tmp_path / "gguf" / "model.gguf"  # its contents are not read
    gguf.parent.mkdir()
    gguf.touch()
    assert _defaults(gguf) == GenerationDefaults()
    shutil.copy(model_dir / "generation_config.json", gguf.parent)
    assert _defaults(gguf).sampling == CHECKPOINT_DEFAULTS


def test_max_new_tokens_is_the_default_and_a_server_set_one_a_cap(model_dir: Path) -> None:
    file = model_dir / "generation_config.json"
    file.write_text(json.dumps({**json.loads(file.read_text()), "max_new_tokens": 40}))
    model = _defaults(model_dir)
    assert (model.max_tokens, model.max_tokens_cap) == (40, None)
    # The default fits what the context leaves; a request's own max_tokens stays its own.
    assert completion_budget(None, [4], MAX_MODEL_LEN, "prompt", model) == 40
    assert completion_budget(None, [30], MAX_MODEL_LEN, "prompt", model) == MAX_MODEL_LEN - 30
    assert completion_budget(50, [4], MAX_MODEL_LEN, "prompt", model) == 50
    # One the operator chose caps every request (vLLM's override_max_tokens).
    server = _defaults(model_dir, override_generation_config={"max_new_tokens": 8})
    assert (server.max_tokens, server.max_tokens_cap) == (8, 8)
    assert completion_budget(50, [4], MAX_MODEL_LEN, "prompt", server) == 8
    with pytest.raises(APIError, match="maximum context length"):  # checked before the cap
        completion_budget(MAX_MODEL_LEN, [4], MAX_MODEL_LEN, "prompt", server)
    named = _defaults(model_dir, generation_config=str(model_dir))
    assert named.max_tokens_cap == 40
    params = _params(_client(model_dir), *CHAT)
    assert params.max_tokens == 40


def test_bad_values_are_refused_naming_the_file(model_dir: Path) -> None:
    file = model_dir / "generation_config.json"
    file.write_text(json.dumps({"top_p": 0}))
    with pytest.raises(CheckpointError, match=r"generation_config\.json: top_p must be"):
        _defaults(model_dir)
    file.write_text("[]")
    with pytest.raises(CheckpointError, match="JSON object"):
        _defaults(model_dir)


def test_the_defaults_taken_and_the_settings_left_are_logged(
    model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="pdserve.engine.generation_config"):
        _defaults(model_dir)
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    message = record.getMessage()
    assert "'temperature': 0.7" in message and "'top_k': 20" in message
    assert "not applied: do_sample, typical_p" in message
    assert "eos_token_id" not in message
