"""The disaggregated cluster on Ray Serve, end to end: router + 1 prefill + 2 decode replicas on
the tiny model, driven by the ``openai`` SDK over HTTP and by grpcio through Serve's gRPC proxy.

Prompts of at least ``LOCAL_MAX`` tokens take the remote path (prefill replica, KV pulled over
NIXL, decode replica); shorter ones prefill on the decode replica. Either way the greedy tokens
equal the offline engine's, which the unit tests hold equal to transformers'.
"""

import asyncio
import json
import urllib.error
import urllib.request

import grpc
import openai
import pytest
import ray
import torch
from ray import serve

from pdserve.cluster.config import ClusterConfig
from pdserve.cluster.serve import APP_NAME, start, stop
from pdserve.engine.llm import LLM
from pdserve.engine.sampling_params import SamplingParams
from pdserve.router.grpc_service import pb, pb_grpc
from pdserve.tests.e2e.serve_replicas import free_port, replica_stats, token_ids, wait_all_free
from pdserve.tests.hf_reference import hf_greedy

pytestmark = pytest.mark.slow

MODEL = "tiny"
NUM_KV_BLOCKS = 512
LOCAL_MAX = 64  # local_prefill_max_tokens
MAX_TOKENS = 8
PROMPT_LENGTHS = [1, 7, 30, 63, 64, 90, 128, 200, 257, 333, 420, 512, 640, 777, 900, 1000]
GREEDY = {"temperature": 0, "max_tokens": MAX_TOKENS, "logprobs": 0}
GREEDY_EXTRA = {"ignore_eos": True, "return_tokens_as_token_ids": True}


@pytest.fixture(scope="module")
def cluster(tiny_model_dir):
    config = ClusterConfig(
        models=[
            {
                "name": MODEL,
                "path": str(tiny_model_dir),
                "engine": {"num_kv_blocks": NUM_KV_BLOCKS},
                "prefill": {"replicas": 1},
                "decode": {"replicas": 2},
                "routing": {"local_prefill_max_tokens": LOCAL_MAX},
            }
        ],
        http_port=free_port(),
        grpc_port=free_port(),
    )
    start(config)
    yield config
    stop()


@pytest.fixture(scope="module")
def client(cluster):
    base_url = f"http://127.0.0.1:{cluster.http_port}/v1"
    with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0) as sdk:
        yield sdk


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(0, 4096, (n,), generator=generator).tolist() for n in PROMPT_LENGTHS]


@pytest.fixture(scope="module")
def expected(tiny_model_dir, prompts) -> list[list[int]]:
    llm = LLM(str(tiny_model_dir), num_kv_blocks=NUM_KV_BLOCKS)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    offline = [out.token_ids for out in llm.generate(prompts, params)]
    assert offline == hf_greedy(tiny_model_dir, [(p, MAX_TOKENS) for p in prompts])
    return offline


def _post(url: str, body: bytes) -> urllib.request.Request:
    return urllib.request.Request(url, body, {"content-type": "application/json"}, method="POST")


POOLS = {f"prefill-{MODEL}": 1, f"decode-{MODEL}": 2}


def _decode_stats() -> dict[str, dict]:
    return replica_stats(f"decode-{MODEL}", 2)


@pytest.mark.parametrize("stream", [False, True])
def test_greedy_equals_offline_on_both_paths(client, prompts, expected, stream):
    for prompt, want in zip(prompts, expected, strict=True):
        response = client.completions.create(
            model=MODEL, prompt=prompt, stream=stream, extra_body=GREEDY_EXTRA, **GREEDY
        )
        if stream:
            tokens = [t for chunk in response for t in chunk.choices[0].logprobs.tokens]
        else:
            tokens = response.choices[0].logprobs.tokens
        assert token_ids(tokens) == want, f"prompt of {len(prompt)} tokens"


def test_short_prompts_prefill_locally_long_ones_remotely(client, prompts):
    router = serve.get_app_handle(APP_NAME)
    before = router.route_decisions.remote().result()[MODEL]
    for prompt in (prompts[1], prompts[-1]):  # 7 and 1,000 tokens
        client.completions.create(model=MODEL, prompt=prompt, extra_body=GREEDY_EXTRA, **GREEDY)
    after = router.route_decisions.remote().result()[MODEL]
    assert after["local"] == before.get("local", 0) + 1
    assert after["remote"] == before.get("remote", 0) + 1
    decode = _decode_stats().values()
    assert sum(s["kv_num_transfers"] for s in decode) >= after["remote"]
    assert all(s["kv_transfer_failures"] == 0 for s in decode)


def test_concurrent_streams_complete_with_usage_and_use_both_decoders(cluster, prompts):
    async def one(sdk: openai.AsyncOpenAI, prompt: list[int]) -> tuple[int, int]:
        stream = await sdk.completions.create(
            model=MODEL,
            prompt=prompt,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
            max_tokens=MAX_TOKENS,
            temperature=0,
        )
        usage = None
        async for chunk in stream:
            usage = chunk.usage or usage
        return usage.prompt_tokens, usage.completion_tokens

    async def run_all() -> list[tuple[int, int]]:
        base_url = f"http://127.0.0.1:{cluster.http_port}/v1"
        async with openai.AsyncOpenAI(
            base_url=base_url, api_key="unused", max_retries=0, timeout=300
        ) as sdk:
            work = [prompts[i % len(prompts)] for i in range(100)]
            return list(zip(work, await asyncio.gather(*(one(sdk, p) for p in work)), strict=True))

    before = _decode_stats()
    for prompt, usage in asyncio.run(run_all()):
        assert usage == (len(prompt), MAX_TOKENS)
    after = _decode_stats()
    for replica, stats in after.items():  # each decode replica took part
        assert stats["prefix_cache_queries"] > before[replica]["prefix_cache_queries"]
    wait_all_free(POOLS)


def test_disconnect_mid_stream_frees_blocks_on_both_sides(cluster, prompts):
    url = f"http://127.0.0.1:{cluster.http_port}/v1/completions"
    body = {
        "model": MODEL,
        "prompt": prompts[-1],  # remote path
        "max_tokens": 400,
        "ignore_eos": True,
        "stream": True,
    }
    with urllib.request.urlopen(_post(url, json.dumps(body).encode()), timeout=60) as response:
        assert response.status == 200
        assert next(line for line in response if line.startswith(b"data:"))
    stats = wait_all_free(POOLS)
    assert all(s["num_running"] == 0 for s in stats.values())


def test_bad_inputs_get_their_envelope_and_serving_goes_on(client, cluster):
    url = f"http://127.0.0.1:{cluster.http_port}/v1/completions"
    with pytest.raises(urllib.error.HTTPError) as malformed:
        urllib.request.urlopen(_post(url, b"{not json"), timeout=60)
    assert malformed.value.code == 400
    assert set(json.load(malformed.value)["error"]) == {"message", "type", "param", "code"}
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="hi", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.completions.create(model=MODEL, prompt=[5] * 5000, max_tokens=2)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt=[99999] * 100, max_tokens=2)
    ok = client.completions.create(model=MODEL, prompt=[5] * 100, max_tokens=2)
    assert ok.usage.completion_tokens >= 1
    wait_all_free(POOLS)


def test_grpc_through_serve_proxy_equals_offline(cluster, prompts, expected):
    metadata = (("application", APP_NAME),)
    with grpc.insecure_channel(f"127.0.0.1:{cluster.grpc_port}") as channel:
        stub = pb_grpc.GenerationStub(channel)
        models = stub.ListModels(pb.ListModelsRequest(), metadata=metadata)
        assert [m.name for m in models.models] == [MODEL]
        for index in (2, 10):  # 30 tokens (local), 512 tokens (remote)
            request = pb.GenerateRequest(
                model=MODEL,
                token_ids=pb.TokenIds(ids=prompts[index]),
                sampling_params=pb.SamplingParams(
                    max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True
                ),
            )
            response = stub.Complete(request, metadata=metadata)
            assert list(response.token_ids) == expected[index]
            streamed = [t for r in stub.Generate(request, metadata=metadata) for t in r.token_ids]
            assert streamed == expected[index]


def test_cluster_ends_with_every_block_free():
    stats = wait_all_free(POOLS)
    assert all(s["kv_pinned_blocks"] == 0 for s in stats.values())
    assert ray.is_initialized()
