"""Several router replicas (``router.replicas``): Serve's proxy spreads requests over them, each
counts its own, the cluster's metrics add them up; one SIGKILLed under streams (sent to each
replica's own port, as the gateway sends them) costs only the streams it carried: the decode
replica stops their calls at once, the other's streams complete with the offline engine's tokens,
new requests are served, every KV block is freed, and Serve starts a replacement. Behind the
gateway (HAProxy, ``pdserve serve --gateway``) each router replica holds at most its bound, and a
burst past both is refused 429 before it reaches them.

Two router replicas in front of an aggregated tiny model (one decode replica, no prefill pool).
"""

import functools
import itertools
import json
import os
import signal
import socket
import threading
import urllib.request
from collections.abc import Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pdserve.benchmarks.openai_http import token_ids
from pdserve.cluster.gateway import Gateway, ingress_servers
from pdserve.cluster.replicas import each_answer
from pdserve.cluster.serve import APP_NAME, free_port
from pdserve.engine.llm import LLM
from pdserve.serving.config import DEFAULT_MAX_CONCURRENT_REQUESTS, ROUTER_DEPLOYMENT
from pdserve.tests.e2e.serve_replicas import (
    offline_greedy,
    random_prompts,
    wait_all_free,
)
from pdserve.tests.e2e.streams import (
    Stream,
    http_stream,
    replica_pids,
    running_by_replica,
    wait,
)
from pdserve.tests.serve_process import pdserve_serve

pytestmark = pytest.mark.slow

MODEL = "tiny-routers"
ROUTERS = 2
DECODE = f"decode-{MODEL}"
NUM_KV_BLOCKS = 256
CALL_S = 10.0
REQUESTS = 24  # at once: Serve's proxy gives each router replica some
STREAMS = 8
# Streams that run on for seconds after a router replica is killed under them.
STREAM_TOKENS = 1200
TOKENS_BEFORE_KILL = 8
GATEWAY_BOUND = 2  # requests a router replica may hold behind the gateway
BURST = 12  # streams at once through the gateway: more than the replicas may hold and queue
BURST_TOKENS = 400


@pytest.fixture(scope="module")
def cluster(ray_cluster, tiny_model_dir):
    model = {
        "name": MODEL,
        "path": str(tiny_model_dir),
        "engine": {"num_kv_blocks": NUM_KV_BLOCKS},
        "prefill": {"replicas": 0},
    }
    config = ray_cluster.config([model], router={"replicas": ROUTERS})
    with ray_cluster.serving(config) as served:
        wait(lambda: len(_each_router("requests_in_flight")) == ROUTERS, "both router replicas")
        yield served


@pytest.fixture(scope="module")
def offline(tiny_model_dir) -> LLM:
    return LLM(str(tiny_model_dir), num_kv_blocks=NUM_KV_BLOCKS)


def _each_router(method: str) -> list[dict]:
    return each_answer(ROUTER_DEPLOYMENT, method, CALL_S)


def _routed() -> list[int]:
    """Each router replica's requests routed so far: its local and remote route decisions."""
    decisions = [d["models"].get(MODEL, {}) for d in _each_router("route_decisions")]
    return [d.get("local", 0) + d.get("remote", 0) for d in decisions]


def _exported_routes(http_url: str) -> float:
    """The cluster's ``route_decisions`` counter for the model, summed over its series."""
    with urllib.request.urlopen(f"{http_url}/metrics", timeout=CALL_S) as response:
        page = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(page)
        if family.name == "ray_pdserve_route_decisions"
        for sample in family.samples
        if sample.name.endswith("_total") and sample.labels.get("model_name") == MODEL
    )


def _complete(http_url: str, prompt: list[int], max_tokens: int) -> list[int]:
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "logprobs": 0,
        "ignore_eos": True,
        "return_tokens_as_token_ids": True,
    }
    request = urllib.request.Request(
        f"{http_url}/v1/completions",
        json.dumps(body).encode(),
        {"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=CALL_S * 6) as response:
        return token_ids(json.load(response)["choices"][0]["logprobs"]["tokens"])


def _at_once(calls: list[Callable[[], list[int]]]) -> list[list[int] | str]:
    """Each call's answer, or its error's repr, all made at once."""
    results: list[list[int] | str] = [""] * len(calls)

    def run(i: int) -> None:
        try:
            results[i] = calls[i]()
        except Exception as error:
            results[i] = repr(error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_both_router_replicas_serve_and_the_metrics_add_them_up(cluster, offline):
    url = f"http://127.0.0.1:{cluster.http_port}"
    before, exported_before = _routed(), _exported_routes(url)
    prompts = random_prompts(0, [24] * REQUESTS)
    answers = _at_once([lambda p=p: _complete(url, p, 8) for p in prompts])
    assert answers == offline_greedy(offline, prompts, 8)
    routed = [after - b for after, b in zip(_routed(), before, strict=True)]
    assert sum(routed) == REQUESTS and min(routed) > 0, routed  # each replica served some
    # Each replica exports its own counts; the page adds both processes' samples.
    want = exported_before + REQUESTS
    wait(lambda: _exported_routes(url) == want, f"{want} route decisions on /metrics")


def test_the_gateway_holds_each_router_replica_to_its_bound(cluster, offline):
    gateway = Gateway(
        functools.partial(ingress_servers, APP_NAME), GATEWAY_BOUND, "127.0.0.1", free_port()
    )
    try:
        assert len(gateway.servers) == ROUTERS
        prompts = random_prompts(3, [16] * BURST)
        streams = [http_stream(gateway.port, MODEL, p, BURST_TOKENS) for p in prompts]
        for stream in streams:
            stream.start()
        held = 0  # the most one router replica held, as each counts its own
        while any(stream.is_alive() for stream in streams):
            counts = [d["models"][MODEL] for d in _each_router("requests_in_flight")]
            held = max([held, *counts])
    finally:
        gateway.stop()
    expected = offline_greedy(offline, prompts, BURST_TOKENS)
    whole = [s for s, e in zip(streams, expected, strict=True) if s.tokens == e and not s.error]
    refused = [s for s in streams if not s.tokens and "HTTP Error 429" in (s.error or "")]
    assert len(whole) + len(refused) == BURST, _ends(streams)  # nothing else: no 5xx, no cut
    assert len(whole) >= ROUTERS * GATEWAY_BOUND and refused, _ends(streams)
    assert 0 < held <= GATEWAY_BOUND


def test_pdserve_gateway_fronts_a_cluster_it_did_not_start(cluster, ray_cluster, offline, tmp_path):
    """``pdserve gateway``, as on a ``ray up`` cluster's head: it finds both router replicas and
    their bound, serves the API through them, and exits 0 on Ctrl-C, its port closed."""
    port = free_port()
    args = ["--address", ray_cluster.address, "--host", "127.0.0.1", "--port", str(port)]
    with pdserve_serve(args, tmp_path, verb="gateway") as log:
        banner = f"-> {ROUTERS} router replicas, {DEFAULT_MAX_CONCURRENT_REQUESTS} requests each"
        assert banner in log.read_text(), log.read_text()
        prompts = random_prompts(4, [24] * ROUTERS)
        answers = [_complete(f"http://127.0.0.1:{port}", p, 8) for p in prompts]
        assert answers == offline_greedy(offline, prompts, 8)
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0, "the gateway's port still answers"


def test_a_router_replica_killed_under_streams_costs_only_its_streams(cluster, offline):
    url = f"http://127.0.0.1:{cluster.http_port}"
    prompts = random_prompts(1, [32] * STREAMS)
    # To each replica's own port in turn, as the gateway sends them: through Serve's proxy a
    # burst of streams may all land on one (a CI run saw 8 and 0).
    servers = ingress_servers(APP_NAME)
    assert len(servers) == ROUTERS
    streams = [
        http_stream(port, MODEL, p, STREAM_TOKENS, host=host)
        for (host, port), p in zip(itertools.cycle(servers), prompts)
    ]
    for stream in streams:
        stream.start()
    wait(lambda: all(len(s.tokens) >= TOKENS_BEFORE_KILL for s in streams), "every stream")
    held = {d["replica"]: d["models"][MODEL] for d in _each_router("requests_in_flight")}
    assert len(held) == ROUTERS and min(held.values()) > 0, held  # both carry streams
    victim, carried = max(held.items(), key=lambda item: item[1])
    os.kill(replica_pids(ROUTER_DEPLOYMENT)[victim], signal.SIGKILL)
    # The decode replica stops what the dead router's streams asked for, while the others run on.
    wait(
        lambda: sum(running_by_replica(DECODE).values()) == STREAMS - carried,
        "the decode replica to stop the dead router's calls",
    )
    # New requests go to the live replica (or the replacement) while the dead one is replaced.
    fresh = random_prompts(2, [16] * 4)
    assert _at_once([lambda p=p: _complete(url, p, 8) for p in fresh]) == offline_greedy(
        offline, fresh, 8
    )
    for stream in streams:
        stream.join(timeout=CALL_S * 12)
    assert not any(stream.is_alive() for stream in streams)
    expected = offline_greedy(offline, prompts, STREAM_TOKENS)
    whole = [s for s, e in zip(streams, expected, strict=True) if s.tokens == e and not s.error]
    cut = [s for s in streams if s not in whole]
    # The dead replica's streams end short (a prefix of the right tokens), the others whole.
    assert len(cut) == carried and len(whole) == STREAMS - carried, (carried, _ends(streams))
    for stream, tokens in zip(streams, expected, strict=True):
        assert stream.tokens == tokens[: len(stream.tokens)]
    wait_all_free({DECODE: 1})
    wait(
        lambda: len(replica_pids(ROUTER_DEPLOYMENT)) == ROUTERS,
        "Serve's replacement router replica",
    )
    wait(lambda: len(_each_router("requests_in_flight")) == ROUTERS, "the replacement answering")


def _ends(streams: list[Stream]) -> list[tuple[int, str | None]]:
    return [(len(s.tokens), s.error) for s in streams]
