"""Servers for the end-to-end tests: the OpenAI HTTP app under uvicorn and the gRPC servicer under
``grpc.aio``, each on a free port in a background thread, over real engines on the tiny model.

Three engines serve as three models: ``tiny`` (normal), ``tiny-overloaded`` (admits nothing:
``max_waiting_requests=0``) and ``tiny-stopped`` (shut down; its servers only report errors).
"""

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import openai
import pytest
import uvicorn

from pdserve.engine.config import EngineConfig
from pdserve.engine.llm import LLM
from pdserve.engine.llm_engine import LLMEngine
from pdserve.router.api.admission import Admission
from pdserve.router.api.api_keys import APIKeys, key_digest
from pdserve.router.api.engine_client import EngineClient
from pdserve.router.api.grpc_service import GenerationServicer, start_grpc_server
from pdserve.router.api.http_app import build_http_app
from pdserve.router.timing import TimingLog
from pdserve.tests.e2e.gated_client import GatedClient
from pdserve.tests.e2e.local_client import LocalEngineClient

MODEL = "tiny"
OVERLOADED_MODEL = "tiny-overloaded"
STOPPED_MODEL = "tiny-stopped"
NUM_KV_BLOCKS = 256  # 4,096 tokens: plenty for these tests, and a small cache to allocate
SMALL_NUM_KV_BLOCKS = 16
STARTUP_TIMEOUT_S = 30.0
IDLE_TIMEOUT_S = 30.0  # generous: CPU steps slow down a lot on a busy machine
POLL_S = 0.02


def _client(model_dir: Path, name: str, **engine_args: int) -> LocalEngineClient:
    return LocalEngineClient.from_config(EngineConfig(model=str(model_dir), **engine_args), name)


@pytest.fixture(scope="session")
def local_client(tiny_model_dir: Path) -> Iterator[LocalEngineClient]:
    client = _client(tiny_model_dir, MODEL, num_kv_blocks=NUM_KV_BLOCKS)
    yield client
    client.shutdown()


@pytest.fixture(scope="session")
def overloaded_client(tiny_model_dir: Path) -> Iterator[LocalEngineClient]:
    client = _client(
        tiny_model_dir, OVERLOADED_MODEL, num_kv_blocks=SMALL_NUM_KV_BLOCKS, max_waiting_requests=0
    )
    yield client
    client.shutdown()


@pytest.fixture(scope="session")
def stopped_client(tiny_model_dir: Path) -> LocalEngineClient:
    client = _client(tiny_model_dir, STOPPED_MODEL, num_kv_blocks=SMALL_NUM_KV_BLOCKS)
    client.shutdown()
    return client


@pytest.fixture(scope="session")
def clients(
    local_client: LocalEngineClient, overloaded_client: LocalEngineClient
) -> dict[str, EngineClient]:
    return {MODEL: local_client, OVERLOADED_MODEL: overloaded_client}


@contextmanager
def _http_server(
    clients: dict[str, EngineClient], timing_log: TimingLog | None = None, **app_args: Any
) -> Iterator[str]:
    """``app_args``: ``build_http_app``'s other arguments (admission, api_keys)."""
    app = build_http_app(clients, timing_log, **app_args)
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(POLL_S)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join()


@pytest.fixture(scope="session")
def http_url(clients: dict[str, EngineClient]) -> Iterator[str]:
    """The base URL (no /v1) of the HTTP app serving ``tiny`` and ``tiny-overloaded``, timing its
    requests as the router does."""
    with _http_server(clients, TimingLog()) as url:
        yield url


def _sdk(http_url: str) -> openai.OpenAI:
    """The OpenAI SDK against ``http_url``, retrying nothing."""
    return openai.OpenAI(base_url=f"{http_url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="session")
def client(http_url: str) -> Iterator[openai.OpenAI]:
    with _sdk(http_url) as sdk:
        yield sdk


@pytest.fixture(scope="module")
def timing_log() -> TimingLog:
    """Where ``timed_client``'s server logs its requests' timings."""
    return TimingLog()


@pytest.fixture(scope="module")
def timed_client(
    clients: dict[str, EngineClient], timing_log: TimingLog
) -> Iterator[openai.OpenAI]:
    """The SDK against a server of its own, logging to ``timing_log``: a request another module
    left in flight on ``http_url`` (a stream it dropped) would be logged when it ends, at any
    time after."""
    with _http_server(clients, timing_log) as url, _sdk(url) as sdk:
        yield sdk


@pytest.fixture(scope="session")
def stopped_http_url(stopped_client: LocalEngineClient) -> Iterator[str]:
    with _http_server({STOPPED_MODEL: stopped_client}) as url:
        yield url


@contextmanager
def _grpc_address(clients: dict[str, EngineClient], **servicer_args: Any) -> Iterator[str]:
    """A ``grpc.aio`` server of ``clients`` on a free port; yields its ``host:port``.
    ``servicer_args``: the servicer's other arguments (admission, api_keys)."""
    # grpc.aio needs a running loop: give the server one of its own, in a thread.
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="grpc-aio", daemon=True)
    thread.start()
    start = start_grpc_server(GenerationServicer(clients, **servicer_args), "127.0.0.1:0")
    server, port = asyncio.run_coroutine_threadsafe(start, loop).result(STARTUP_TIMEOUT_S)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(None), loop).result(STARTUP_TIMEOUT_S)
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


@contextmanager
def _grpc_server(clients: dict[str, EngineClient], **servicer_args: Any) -> Iterator[grpc.Channel]:
    with (
        _grpc_address(clients, **servicer_args) as address,
        grpc.insecure_channel(address) as channel,
    ):
        yield channel


@pytest.fixture(scope="session")
def grpc_channel(clients: dict[str, EngineClient]) -> Iterator[grpc.Channel]:
    with _grpc_server(clients) as channel:
        yield channel


@pytest.fixture(scope="session")
def stopped_grpc_channel(stopped_client: LocalEngineClient) -> Iterator[grpc.Channel]:
    with _grpc_server({STOPPED_MODEL: stopped_client}) as channel:
        yield channel


@pytest.fixture
def aborted(local_client: LocalEngineClient, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The request ids the ``tiny`` engine is told to abort: proof that an abort, not a natural
    end, finished them."""
    engine = local_client.engine.engine
    calls: list[str] = []
    real_abort = engine.abort_request
    monkeypatch.setattr(engine, "abort_request", lambda rid: (calls.append(rid), real_abort(rid)))
    return calls


@pytest.fixture(scope="session")
def offline(tiny_model_dir: Path) -> LLM:
    """The offline engine, whose greedy outputs the servers must reproduce token for token."""
    return LLM(model=str(tiny_model_dir), num_kv_blocks=NUM_KV_BLOCKS)


@pytest.fixture(scope="session")
def wait_idle() -> Callable[[LLMEngine], None]:
    """Waits until ``engine`` has no unfinished request, then checks every KV block is free."""

    def wait(engine: LLMEngine) -> None:
        deadline = time.monotonic() + IDLE_TIMEOUT_S
        while engine.has_unfinished_requests():
            assert time.monotonic() < deadline, "the engine is still busy"
            time.sleep(POLL_S)
        stats = engine.stats()
        assert stats.num_free_blocks == engine.block_pool.num_blocks, stats

    return wait


@pytest.fixture(scope="session")
def grpc_address(clients: dict[str, EngineClient]) -> Iterator[str]:
    """``host:port`` of a gRPC server of ``tiny`` and ``tiny-overloaded``, for clients that open
    their own channel (``pdserve bench serve --grpc``)."""
    with _grpc_address(clients) as address:
        yield address


LIMITED_MAX_REQUESTS = 2  # max_concurrent_requests of each model on the limited servers
API_KEYS = ("sk-test-first-key", "sk-test-second-key")


@pytest.fixture(scope="session")
def gated_client(local_client: LocalEngineClient) -> GatedClient:
    """``tiny`` behind a gate the tests close to hold requests in flight."""
    return GatedClient(local_client)


@pytest.fixture(scope="session")
def admission() -> Admission:
    """The one bound both limited servers count against (as the APIIngress's HTTP app and gRPC
    servicer share theirs)."""
    return Admission(dict.fromkeys((MODEL, OVERLOADED_MODEL), LIMITED_MAX_REQUESTS))


@pytest.fixture(scope="session")
def limited_clients(
    gated_client: GatedClient, overloaded_client: LocalEngineClient
) -> dict[str, EngineClient]:
    return {MODEL: gated_client, OVERLOADED_MODEL: overloaded_client}


@pytest.fixture(scope="session")
def limited_http_url(
    limited_clients: dict[str, EngineClient], admission: Admission
) -> Iterator[str]:
    """The HTTP app over ``limited_clients``, each model bounded to ``LIMITED_MAX_REQUESTS``."""
    with _http_server(limited_clients, admission=admission) as url:
        yield url


@pytest.fixture(scope="session")
def limited_grpc_channel(
    limited_clients: dict[str, EngineClient], admission: Admission
) -> Iterator[grpc.Channel]:
    """The gRPC servicer over ``limited_clients``, counting against the HTTP app's bound."""
    with _grpc_server(limited_clients, admission=admission) as channel:
        yield channel


@pytest.fixture(scope="session")
def api_keys() -> APIKeys:
    return APIKeys(key_digest(key) for key in API_KEYS)


@pytest.fixture(scope="session")
def keyed_http_url(clients: dict[str, EngineClient], api_keys: APIKeys) -> Iterator[str]:
    """The HTTP app of ``tiny`` and ``tiny-overloaded`` that asks for one of ``API_KEYS``."""
    with _http_server(clients, api_keys=api_keys) as url:
        yield url


@pytest.fixture(scope="session")
def keyed_grpc_channel(
    clients: dict[str, EngineClient], api_keys: APIKeys
) -> Iterator[grpc.Channel]:
    with _grpc_server(clients, api_keys=api_keys) as channel:
        yield channel
