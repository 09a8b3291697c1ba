"""The disaggregated cluster on Ray Serve, end to end: router + 1 prefill + 2 decode replicas on
the tiny model (the session's shared app, fresh: this module is its first), driven by the
``openai`` SDK over HTTP and by grpcio through Serve's gRPC proxy.

Prompts of at least ``LOCAL_MAX`` tokens not cached at their decode replica take the remote path
(prefill replica, KV pulled over NIXL, decode replica); shorter ones, and repeats, prefill on the
decode replica. Either way the greedy tokens equal the offline engine's, which the unit tests hold
equal to transformers'.
"""

import asyncio
import collections
import json
import time
import urllib.error
import urllib.request

import grpc
import openai
import pytest
import ray
from ray import serve

from pdserve.benchmarks.openai_http import token_ids
from pdserve.cluster.serve import APP_NAME
from pdserve.engine.llm import LLM
from pdserve.engine.sampling_params import SamplingParams
from pdserve.router.api.grpc_service import pb, pb_grpc
from pdserve.serving.config import DEFAULT_ROUTING_STATS_PERIOD_S
from pdserve.tests.e2e.serve_replicas import (
    SHARED_LOCAL_MAX,
    SHARED_MODEL,
    SHARED_NUM_KV_BLOCKS,
    SHARED_POOLS,
    offline_greedy,
    random_prompts,
    wait_all_free,
    wait_replica_stats,
)
from pdserve.tests.hf_reference import hf_greedy

pytestmark = pytest.mark.slow

MODEL, POOLS, LOCAL_MAX = SHARED_MODEL, SHARED_POOLS, SHARED_LOCAL_MAX  # local_prefill_max_tokens
MAX_TOKENS = 8
PROMPT_LENGTHS = [1, 7, 30, 63, 64, 90, 128, 200, 257, 333, 420, 512, 640, 777, 900, 1000]
GREEDY = {"temperature": 0, "max_tokens": MAX_TOKENS, "logprobs": 0}
GREEDY_EXTRA = {"ignore_eos": True, "return_tokens_as_token_ids": True}


@pytest.fixture(scope="module")
def cluster(shared_app):
    return shared_app


@pytest.fixture(scope="module")
def client(cluster):
    base_url = f"http://127.0.0.1:{cluster.http_port}/v1"
    with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0) as sdk:
        yield sdk


def _prompts(seed: int, lengths: list[int] = PROMPT_LENGTHS) -> list[list[int]]:
    return random_prompts(seed, lengths)


@pytest.fixture(scope="module")
def offline(tiny_model_dir) -> LLM:
    return LLM(str(tiny_model_dir), num_kv_blocks=SHARED_NUM_KV_BLOCKS)


def _greedy(offline: LLM, prompts: list[list[int]]) -> list[list[int]]:
    return offline_greedy(offline, prompts, MAX_TOKENS)


@pytest.fixture(scope="module")
def prompt_sets() -> dict[bool, list[list[int]]]:
    """One set of the 16 prompts for each of the streamed and the non-streamed run."""
    return {False: _prompts(seed=0), True: _prompts(seed=1)}


@pytest.fixture(scope="module")
def prompts(prompt_sets) -> list[list[int]]:
    return prompt_sets[False]


@pytest.fixture(scope="module")
def expected(tiny_model_dir, offline, prompt_sets) -> dict[bool, list[list[int]]]:
    result = {}
    for stream, prompts in prompt_sets.items():
        result[stream] = _greedy(offline, prompts)
        assert result[stream] == hf_greedy(tiny_model_dir, [(p, MAX_TOKENS) for p in prompts])
    return result


def _route_decisions() -> dict[str, int]:
    return collections.Counter(
        serve.get_app_handle(APP_NAME).route_decisions.remote().result()["models"][MODEL]
    )


def _post(url: str, body: bytes) -> urllib.request.Request:
    return urllib.request.Request(url, body, {"content-type": "application/json"}, method="POST")


def _decode_stats() -> dict[str, dict]:
    return wait_replica_stats(f"decode-{MODEL}", 2)


@pytest.mark.parametrize("stream", [False, True])
def test_greedy_equals_offline_on_both_paths(client, prompt_sets, expected, stream):
    before = _route_decisions()
    prompts = prompt_sets[stream]
    for prompt, want in zip(prompts, expected[stream], strict=True):
        response = client.completions.create(
            model=MODEL, prompt=prompt, stream=stream, extra_body=GREEDY_EXTRA, **GREEDY
        )
        if stream:
            tokens = [t for chunk in response for t in chunk.choices[0].logprobs.tokens]
        else:
            tokens = response.choices[0].logprobs.tokens
        assert token_ids(tokens) == want, f"prompt of {len(prompt)} tokens"
    routed = _route_decisions() - before
    long_prompts = sum(len(p) >= LOCAL_MAX for p in prompts)
    assert routed == collections.Counter(
        remote=long_prompts, local=len(prompts) - long_prompts, **{"local:short": 4}
    )


def _wait_router_sees_no_load(timeout: float = 30.0) -> None:
    """Until the router's placements see no load on any replica (reports come every
    ``DEFAULT_ROUTING_STATS_PERIOD_S``)."""
    router, deadline = serve.get_app_handle(APP_NAME), time.monotonic() + timeout
    while True:
        views = router.placements.remote().result().get(MODEL, {})
        loads = [r["load_tokens"] for pool in views.values() for r in pool.values()]
        if set(views) == {"prefill", "decode"} and not any(loads):
            return
        assert time.monotonic() < deadline, views
        time.sleep(DEFAULT_ROUTING_STATS_PERIOD_S / 5)


def test_prompts_prefill_locally_when_short_or_cached_at_the_decoder(client, offline):
    short, long = _prompts(seed=2, lengths=[7, 1000])
    want = _greedy(offline, [short, long])
    before = _route_decisions()
    outputs = []
    for prompt in (short, long, long):  # the repeat finds the whole prompt at its decode replica
        # Once the router sees the last request's blocks free again: until then the replica
        # holding the prefix also looks loaded by as much, and the router may choose the other.
        wait_all_free(POOLS)
        _wait_router_sees_no_load()
        response = client.completions.create(
            model=MODEL, prompt=prompt, extra_body=GREEDY_EXTRA, **GREEDY
        )
        outputs.append(token_ids(response.choices[0].logprobs.tokens))
    assert outputs == [want[0], want[1], want[1]]
    routed = _route_decisions() - before
    assert routed == collections.Counter(local=2, remote=1, **{"local:short": 1, "local:cached": 1})
    decode = _decode_stats().values()
    assert sum(s["kv_num_transfers"] for s in decode) >= routed["remote"]
    assert all(s["kv_transfer_failures"] == 0 for s in decode)


def test_seeded_sampling_is_the_same_on_the_remote_path(client, offline):
    # The prefill replica samples the first token, the decode replica the rest: with a seed, the
    # tokens are the offline engine's, as on the local path.
    prompt = _prompts(seed=5, lengths=[300])[0]
    sampled = {"temperature": 1.0, "max_tokens": MAX_TOKENS, "ignore_eos": True}
    want, other = (
        offline.generate([prompt], SamplingParams(seed=seed, **sampled))[0].token_ids
        for seed in (1234, 4321)
    )
    assert want != other  # the seed decides the tokens: a wrong stream would show
    before = _route_decisions()
    response = client.completions.create(
        model=MODEL,
        prompt=prompt,
        temperature=1.0,
        max_tokens=MAX_TOKENS,
        seed=1234,
        logprobs=0,
        extra_body=GREEDY_EXTRA,
    )
    routed = _route_decisions() - before
    assert routed["remote"] == 1, routed
    assert token_ids(response.choices[0].logprobs.tokens) == want


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


def test_disconnect_mid_stream_frees_blocks_on_both_sides(cluster):
    url = f"http://127.0.0.1:{cluster.http_port}/v1/completions"
    body = {
        "model": MODEL,
        "prompt": _prompts(seed=3, lengths=[1000])[0],  # unseen, so the remote path
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


def test_grpc_through_serve_proxy_equals_offline(cluster, offline):
    prompts = _prompts(seed=4, lengths=[30, 512])  # local, then remote
    expected = _greedy(offline, prompts)
    before = _route_decisions()
    metadata = (("application", APP_NAME),)
    with grpc.insecure_channel(f"127.0.0.1:{cluster.grpc_port}") as channel:
        stub = pb_grpc.GenerationStub(channel)
        models = stub.ListModels(pb.ListModelsRequest(), metadata=metadata)
        assert [m.name for m in models.models] == [MODEL]
        for prompt, want in zip(prompts, expected, strict=True):
            request = pb.GenerateRequest(
                model=MODEL,
                token_ids=pb.TokenIds(ids=prompt),
                sampling_params=pb.SamplingParams(
                    max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True
                ),
            )
            streamed = [t for r in stub.Generate(request, metadata=metadata) for t in r.token_ids]
            assert streamed == want
            response = stub.Complete(request, metadata=metadata)
            assert list(response.token_ids) == want
    # The long prompt's first call went remote; its repeat found it cached at its decoder.
    routed = _route_decisions() - before
    assert routed["remote"] == 1, routed


def test_cluster_ends_with_every_block_free(cluster):
    stats = wait_all_free(POOLS)
    assert all(s["kv_pinned_blocks"] == 0 for s in stats.values())
    assert ray.is_initialized()
