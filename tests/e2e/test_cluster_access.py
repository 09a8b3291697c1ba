"""API keys and the bound on requests in flight through the real ingress on Ray Serve: the keys
reach the router replica (as digests) and guard HTTP and gRPC through Serve's proxies, the probes
stay open, and past ``max_concurrent_requests`` the router answers 429 at once and counts back to
0 (aggregated tiny model: one decode replica, no prefill pool)."""

import json
import time
import urllib.error
import urllib.request

import grpc
import openai
import pytest
from ray import serve

from pdserve.cluster.serve import APP_NAME
from pdserve.router.api.errors import RETRY_AFTER_S
from pdserve.router.api.grpc_service import pb, pb_grpc

pytestmark = pytest.mark.slow

MODEL = "tiny"
KEY = "sk-cluster-test-key"
MAX_CONCURRENT = 1
LONG_TOKENS = 1500  # far longer than the test waits: only a cancellation ends it in time
TIMEOUT_S = 60.0
POLL_S = 0.05
GRPC_APP = ("application", APP_NAME)


@pytest.fixture(scope="module")
def cluster(ray_cluster, tiny_model_dir):
    model = {
        "name": MODEL,
        "path": str(tiny_model_dir),
        "prefill": {"replicas": 0},
        "max_concurrent_requests": MAX_CONCURRENT,
    }
    config = ray_cluster.config([model], api_keys=[KEY])
    with ray_cluster.serving(config) as served:
        yield served


def _in_flight() -> dict[str, int]:
    return serve.get_app_handle(APP_NAME).requests_in_flight.remote().result()["models"]


def _request(url: str, body: dict, key: str | None) -> urllib.request.Request:
    headers = {"content-type": "application/json"}
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    return urllib.request.Request(url, json.dumps(body).encode(), headers, method="POST")


def test_http_needs_a_key_and_health_does_not(cluster):
    base = f"http://127.0.0.1:{cluster.http_port}"
    with urllib.request.urlopen(f"{base}/health", timeout=TIMEOUT_S) as health:
        assert health.status == 200
    with openai.OpenAI(base_url=f"{base}/v1", api_key="sk-wrong", max_retries=0) as sdk:
        with pytest.raises(openai.AuthenticationError) as refused:
            sdk.models.list()
        assert refused.value.code == "invalid_api_key"
        assert KEY not in str(refused.value) and "sk-wrong" not in str(refused.value)
    with openai.OpenAI(base_url=f"{base}/v1", api_key=KEY, max_retries=0) as sdk:
        assert [m.id for m in sdk.models.list().data] == [MODEL]
        completion = sdk.completions.create(model=MODEL, prompt="hello", max_tokens=2)
        assert completion.usage.completion_tokens >= 1


def test_grpc_needs_a_key_in_the_metadata(cluster):
    request = pb.GenerateRequest(
        model=MODEL, text="hello", sampling_params=pb.SamplingParams(max_tokens=2)
    )
    with grpc.insecure_channel(f"127.0.0.1:{cluster.grpc_port}") as channel:
        stub = pb_grpc.GenerationStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.Complete(request, metadata=(GRPC_APP,), timeout=TIMEOUT_S)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        keyed = (GRPC_APP, ("authorization", f"Bearer {KEY}"))
        assert stub.Complete(request, metadata=keyed, timeout=TIMEOUT_S).usage.completion_tokens
        assert stub.Health(pb.HealthRequest(), metadata=(GRPC_APP,), timeout=TIMEOUT_S) == (
            pb.HealthResponse()
        )


def test_past_the_bound_the_router_answers_429_and_counts_back_to_zero(cluster):
    url = f"http://127.0.0.1:{cluster.http_port}/v1/completions"
    long = {"model": MODEL, "prompt": "hello", "max_tokens": LONG_TOKENS, "ignore_eos": True}
    with urllib.request.urlopen(_request(url, {**long, "stream": True}, KEY), timeout=60) as held:
        assert next(line for line in held if line.startswith(b"data:"))
        assert _in_flight() == {MODEL: MAX_CONCURRENT}
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(_request(url, long, KEY), timeout=TIMEOUT_S)
        assert refused.value.code == 429
        assert refused.value.headers.get("Retry-After") == str(RETRY_AFTER_S)
        assert json.load(refused.value)["error"]["code"] == "too_many_requests"
    deadline = time.monotonic() + TIMEOUT_S
    while _in_flight() != {MODEL: 0}:  # the closed stream gives its slot back
        assert time.monotonic() < deadline, _in_flight()
        time.sleep(POLL_S)
