"""The gRPC API through a ``grpcio`` client against a ``grpc.aio`` server hosting the servicer:
greedy tokens equal the offline engine's, streamed (Generate) or whole (Complete); logprobs;
errors as status codes; cancelling a stream aborts it and frees its blocks."""

from collections.abc import Callable

import grpc
import pytest

from pdserve.engine.llm import LLM
from pdserve.engine.llm_engine import LLMEngine
from pdserve.engine.outputs import RequestOutput
from pdserve.engine.sampling_params import SamplingParams
from pdserve.router.api.grpc_service import pb, pb_grpc
from pdserve.tests.e2e.local_client import LocalEngineClient

MODEL = "tiny"
OVERLOADED_MODEL = "tiny-overloaded"
STOPPED_MODEL = "tiny-stopped"
PROMPT = "The capital of France is"
MAX_TOKENS = 8
LONG = 1500
TIMEOUT_S = 60.0
GREEDY = pb.SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
def stub(grpc_channel: grpc.Channel) -> pb_grpc.GenerationStub:
    return pb_grpc.GenerationStub(grpc_channel)


@pytest.fixture(scope="module")
def reference(offline: LLM) -> RequestOutput:
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    return offline.generate(PROMPT, params)[0]


def test_complete_equals_offline(stub: pb_grpc.GenerationStub, reference: RequestOutput) -> None:
    response = stub.Complete(
        pb.GenerateRequest(model=MODEL, text=PROMPT, sampling_params=GREEDY), timeout=TIMEOUT_S
    )
    assert list(response.token_ids) == reference.token_ids
    assert response.text == reference.text
    assert response.finish_reason == "length"
    assert response.usage.prompt_tokens == len(reference.prompt_token_ids)
    assert response.usage.completion_tokens == MAX_TOKENS


def test_generate_streams_the_offline_tokens(
    stub: pb_grpc.GenerationStub, reference: RequestOutput
) -> None:
    ids = pb.TokenIds(ids=reference.prompt_token_ids)
    request = pb.GenerateRequest(token_ids=ids, sampling_params=GREEDY)  # default model
    messages = list(stub.Generate(request, timeout=TIMEOUT_S))
    assert [t for m in messages for t in m.token_ids] == reference.token_ids
    assert "".join(m.text for m in messages) == reference.text
    *deltas, last = messages
    assert all(not m.finish_reason and not m.HasField("usage") for m in deltas)
    assert last.finish_reason == "length" and last.usage.completion_tokens == MAX_TOKENS
    assert len({m.request_id for m in messages}) == 1


def test_logprobs_and_stop_reason(stub: pb_grpc.GenerationStub, reference: RequestOutput) -> None:
    ids = reference.token_ids
    # Stop at the first token not seen before it (past the first), or else at the first.
    end = next((i for i in range(1, len(ids)) if ids[i] not in ids[:i]), 0) + 1
    params = pb.SamplingParams(temperature=0, max_tokens=MAX_TOKENS, logprobs=2)
    params.stop_token_ids.append(ids[end - 1])
    response = stub.Complete(
        pb.GenerateRequest(model=MODEL, text=PROMPT, sampling_params=params), timeout=TIMEOUT_S
    )
    assert list(response.token_ids) == ids[:end]
    assert response.finish_reason == "stop"
    assert response.stop_token_id == ids[end - 1]
    assert len(response.logprobs) == end
    for token_id, position in zip(response.token_ids, response.logprobs, strict=True):
        assert position.sampled.token_id == token_id and position.sampled.rank == 1
        assert [lp.rank for lp in position.top] == [1, 2]
        assert position.top[0].token_id == token_id


def test_list_models_and_health(stub: pb_grpc.GenerationStub) -> None:
    models = stub.ListModels(pb.ListModelsRequest(), timeout=TIMEOUT_S).models
    assert {(m.name, m.max_model_len) for m in models} == {(MODEL, 2048), (OVERLOADED_MODEL, 2048)}
    stub.Health(pb.HealthRequest(), timeout=TIMEOUT_S)


BAD_REQUESTS = {
    "no prompt": (pb.GenerateRequest(model=MODEL), grpc.StatusCode.INVALID_ARGUMENT, "prompt"),
    "negative max_tokens": (
        pb.GenerateRequest(text="x", sampling_params=pb.SamplingParams(max_tokens=-1)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "max_tokens",
    ),
    "over the context": (
        pb.GenerateRequest(text="x", sampling_params=pb.SamplingParams(max_tokens=4096)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "maximum context length",
    ),
    "unknown model": (
        pb.GenerateRequest(model="gpt-9", text="x"),
        grpc.StatusCode.NOT_FOUND,
        "gpt-9",
    ),
    "overloaded": (
        pb.GenerateRequest(model=OVERLOADED_MODEL, text="x"),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "overloaded",
    ),
}


@pytest.mark.parametrize("case", BAD_REQUESTS)
@pytest.mark.parametrize("method", ["Complete", "Generate"])
def test_bad_request_gets_its_status(stub: pb_grpc.GenerationStub, method: str, case: str) -> None:
    request, code, words = BAD_REQUESTS[case]
    with pytest.raises(grpc.RpcError) as error:
        response = getattr(stub, method)(request, timeout=TIMEOUT_S)  # a unary call raises here
        if method == "Generate":
            list(response)
    assert error.value.code() == code
    assert words in error.value.details()
    # The server keeps serving.
    ok = pb.GenerateRequest(text="x", sampling_params=pb.SamplingParams(max_tokens=1))
    assert stub.Complete(ok, timeout=TIMEOUT_S).usage.completion_tokens == 1


def test_stopped_engine_is_unavailable(stopped_grpc_channel: grpc.Channel) -> None:
    stub = pb_grpc.GenerationStub(stopped_grpc_channel)
    for call in (
        lambda: stub.Health(pb.HealthRequest(), timeout=TIMEOUT_S),
        lambda: stub.Complete(pb.GenerateRequest(model=STOPPED_MODEL, text="x"), timeout=TIMEOUT_S),
    ):
        with pytest.raises(grpc.RpcError) as error:
            call()
        assert error.value.code() == grpc.StatusCode.UNAVAILABLE


def test_cancelling_a_stream_aborts_it(
    stub: pb_grpc.GenerationStub,
    local_client: LocalEngineClient,
    aborted: list[str],
    wait_idle: Callable[[LLMEngine], None],
) -> None:
    params = pb.SamplingParams(max_tokens=LONG, ignore_eos=True)
    call = stub.Generate(pb.GenerateRequest(text=PROMPT, sampling_params=params))
    first = next(call)
    next(call)
    call.cancel()
    wait_idle(local_client.engine.engine)
    assert aborted == [f"{first.request_id}-0"]
