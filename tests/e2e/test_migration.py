"""A decode replica killed mid-stream (SIGKILL of its process): its requests go on at another
replica, and each client's stream, HTTP or gRPC, carries exactly the fault-free greedy tokens;
killed again beyond ``migration_limit``, a stream ends with the in-band error. A prefill replica
killed before a request, or while the request is inside its prefill call (held there by the
replica's test hook): the prompt prefills at its decode replica, to the same tokens. ``pdserve bench
chaos`` runs against it too (a decode kill, streams abandoned): every accepted stream ends whole,
and every replica frees every block.

Router + 1 prefill + 2 decode replicas of the tiny model (the session's shared app, after
test_cluster's tests); Serve starts a new replica for each one killed, and the test waits for it
before going on.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from ray import serve
from ray.util.state import list_actors

from pdserve.benchmarks.chaos_replicas import migrations
from pdserve.cluster.replicas import answering_replica_stats
from pdserve.cluster.serve import APP_NAME
from pdserve.engine.llm import LLM
from pdserve.router.api.grpc_service import pb, pb_grpc
from pdserve.tests.e2e.serve_replicas import (
    SHARED_MIGRATION_LIMIT,
    SHARED_MODEL,
    SHARED_NUM_KV_BLOCKS,
    SHARED_POOLS,
    offline_greedy,
    random_prompts,
    token_ids,
    wait_all_free,
)

pytestmark = pytest.mark.slow

MODEL, POOLS, MIGRATION_LIMIT = SHARED_MODEL, SHARED_POOLS, SHARED_MIGRATION_LIMIT
DECODE, PREFILL = f"decode-{MODEL}", f"prefill-{MODEL}"
FIRST_SEED = 100
# Long enough that a stream is still running when its replica is killed, and after it moved.
MAX_TOKENS = 240
TOKENS_BEFORE_KILL = 12
PROMPT_LENGTHS = [40, 300, 90, 500]  # short ones prefill at the decode replica, long remotely
WAIT_S = 120.0
# bench chaos: 4 streams for 15 s, one decode kill at 8 s, some streams abandoned by the client
# (seed 0 abandons the fourth stream's second request); it exits well within CHAOS_TIMEOUT_S.
CHAOS_ARGS = ["--streams", "4", "--seconds", "15", "--kill-every", "8", "--kill", "decode"]
CHAOS_ARGS += ["--disconnect-fraction", "0.3", "--input-len", "32", "--output-len", "48"]
CHAOS_TIMEOUT_S = 300.0
POLL_S = 0.05


@pytest.fixture(scope="module")
def cluster(shared_app):
    return shared_app


def _prompts(seed: int) -> list[list[int]]:
    # Seeds of this module's own: test_cluster's prompts (seeds 0-5) are cached in the shared app.
    return random_prompts(FIRST_SEED + seed, PROMPT_LENGTHS)


@pytest.fixture(scope="module")
def offline(tiny_model_dir) -> LLM:
    return LLM(str(tiny_model_dir), num_kv_blocks=SHARED_NUM_KV_BLOCKS)


def _greedy(offline: LLM, prompts: list[list[int]]) -> list[list[int]]:
    return offline_greedy(offline, prompts, MAX_TOKENS)


class Stream(threading.Thread):
    """One streamed request in a thread: the token ids as they come, and how it ended."""

    def __init__(self, read: Callable[["Stream"], None]) -> None:
        super().__init__(daemon=True)
        self.tokens: list[int] = []
        self.error: str | None = None
        self._read = read

    def run(self) -> None:
        try:
            self._read(self)
        except Exception as error:
            self.error = f"{type(error).__name__}: {error}"


def _http_stream(port: int, prompt: list[int]) -> Stream:
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "logprobs": 0,
        "stream": True,
        "ignore_eos": True,
        "return_tokens_as_token_ids": True,
    }

    def read(stream: Stream) -> None:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions",
            json.dumps(body).encode(),
            {"content-type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=WAIT_S) as response:
            for line in response:
                data = line.decode().removeprefix("data:").strip()
                if not data or data == "[DONE]":
                    continue
                event = json.loads(data)
                if "error" in event:  # the in-band error: the status line went out long ago
                    stream.error = event["error"]["message"]
                    return
                for choice in event["choices"]:
                    stream.tokens += token_ids((choice["logprobs"] or {}).get("tokens") or [])

    return Stream(read)


def _grpc_stream(port: int, prompt: list[int]) -> Stream:
    request = pb.GenerateRequest(
        model=MODEL,
        token_ids=pb.TokenIds(ids=prompt),
        sampling_params=pb.SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True),
    )

    def read(stream: Stream) -> None:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            responses = pb_grpc.GenerationStub(channel).Generate(
                request, metadata=(("application", APP_NAME),), timeout=WAIT_S
            )
            for response in responses:
                stream.tokens += response.token_ids

    return Stream(read)


def _wait(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(POLL_S)


def _pids(deployment: str) -> dict[str, int]:
    """Each live replica's process id, by Serve replica id (the end of its actor name)."""
    actors = list_actors(filters=[("state", "=", "ALIVE")], limit=1000)
    return {
        actor.name.rsplit("#", 1)[-1]: actor.pid
        for actor in actors
        if actor.name and f"#{deployment}#" in actor.name
    }


def _wait_for_two_decode_replicas() -> None:
    # Both answer this process's handle, which learns of a new replica a moment after Serve.
    _wait(lambda: len(_running_by_replica()) == POOLS[DECODE], "two decode replicas")


def _running_by_replica() -> dict[str, int]:
    """Requests running or waiting on each decode replica that answers: a killed one's successor
    may still be starting, and this process's handle may not know yet of one killed just now."""
    stats = answering_replica_stats(DECODE)
    return {replica: s["num_running"] + s["num_waiting"] for replica, s in stats.items()}


def _kill_busiest_decode_replica() -> int:
    """SIGKILLs the decode replica with the most requests; returns how many it had."""
    running = _running_by_replica()
    replica, busiest = max(running.items(), key=lambda item: item[1])
    assert busiest > 0, (running, _pids(DECODE))
    os.kill(_pids(DECODE)[replica], signal.SIGKILL)
    return busiest


def test_streams_of_a_killed_decode_replica_finish_elsewhere_with_the_same_tokens(cluster, offline):
    _wait_for_two_decode_replicas()
    prompts = _prompts(seed=0)
    expected = _greedy(offline, prompts)
    streams = [
        (_http_stream if i % 2 == 0 else _grpc_stream)(
            cluster.http_port if i % 2 == 0 else cluster.grpc_port, prompt
        )
        for i, prompt in enumerate(prompts)
    ]
    before = migrations(MODEL)
    for stream in streams:
        stream.start()
    _wait(lambda: all(len(s.tokens) >= TOKENS_BEFORE_KILL for s in streams), "the first tokens")
    assert all(len(s.tokens) < MAX_TOKENS for s in streams), "a stream ended before the kill"
    moved = _kill_busiest_decode_replica()
    for stream in streams:
        stream.join(WAIT_S)
    assert [s.error for s in streams] == [None] * len(streams)
    assert [s.tokens for s in streams] == expected
    assert migrations(MODEL) - before == moved


def test_a_stream_lost_beyond_the_migration_limit_ends_with_the_in_band_error(cluster):
    _wait_for_two_decode_replicas()
    stream = _http_stream(cluster.http_port, _prompts(seed=1)[0])
    before = migrations(MODEL)
    stream.start()
    for kill in range(MIGRATION_LIMIT + 1):
        # Past the last kill's migration, and a few tokens from the replica it moved to.
        _wait(lambda kill=kill: migrations(MODEL) - before == kill, "the migration")
        goal = len(stream.tokens) + TOKENS_BEFORE_KILL
        _wait(lambda goal=goal: len(stream.tokens) >= goal or not stream.is_alive(), "tokens")
        assert stream.is_alive() and len(stream.tokens) < MAX_TOKENS, "it ended before the kill"
        assert _kill_busiest_decode_replica() == 1
    stream.join(WAIT_S)
    assert stream.error is not None and "migration_limit 1" in stream.error, stream.error
    assert migrations(MODEL) - before == MIGRATION_LIMIT


def test_a_killed_prefill_replica_leaves_its_prompts_to_the_decode_replicas(cluster, offline):
    prompts = _prompts(seed=2)[1::2]  # the long ones, which go remote while the pool is up
    expected = _greedy(offline, prompts)
    _wait(lambda: len(_pids(PREFILL)) == POOLS[PREFILL], "the prefill replica")
    (pid,) = _pids(PREFILL).values()
    os.kill(pid, signal.SIGKILL)
    streams = [_http_stream(cluster.http_port, prompt) for prompt in prompts]
    for stream in streams:
        stream.start()
        stream.join(WAIT_S)
    assert [s.error for s in streams] == [None] * len(streams)
    assert [s.tokens for s in streams] == expected


def _held_prefills() -> int:
    return sum(s["held_prefills"] for s in answering_replica_stats(PREFILL).values())


def test_a_prefill_replica_killed_inside_its_call_leaves_the_prompt_to_the_decode_replica(
    cluster, offline
):
    prompt = _prompts(seed=3)[3]  # long: it goes remote while the pool is up
    (expected,) = _greedy(offline, [prompt])
    _wait(lambda: len(answering_replica_stats(PREFILL)) == POOLS[PREFILL], "the prefill replica")
    (pid,) = _pids(PREFILL).values()
    prefill = serve.get_deployment_handle(PREFILL, app_name=APP_NAME)
    prefill.hold_prefills.remote(True).result()
    killed = False
    try:
        stream = _http_stream(cluster.http_port, prompt)
        stream.start()
        _wait(lambda: _held_prefills() == 1, "the request inside the prefill call")
        os.kill(pid, signal.SIGKILL)
        killed = True
        stream.join(WAIT_S)
    finally:
        if not killed:
            prefill.hold_prefills.remote(False).result()
    assert stream.error is None and stream.tokens == expected


def test_bench_chaos_ends_every_stream_and_frees_every_block_after_a_decode_kill(
    cluster, ray_cluster, tiny_model_dir: Path, tmp_path: Path
):
    _wait_for_two_decode_replicas()
    _wait(lambda: len(_pids(PREFILL)) == POOLS[PREFILL], "the prefill replica")
    out = tmp_path / "chaos.json"
    argv = ["--url", f"http://127.0.0.1:{cluster.http_port}", "--address", ray_cluster.address]
    argv += ["--model", MODEL, "--tokenizer", str(tiny_model_dir), "--out", str(out), *CHAOS_ARGS]
    pdserve = Path(sys.executable).with_name("pdserve")
    run = subprocess.run(
        [str(pdserve), "bench", "chaos", *argv],
        capture_output=True,
        text=True,
        timeout=CHAOS_TIMEOUT_S,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(out.read_text())
    summary = result["summary"]
    assert summary["failed"] == 0 and summary["completed"] > 0 and summary["abandoned"] > 0
    assert summary["started"] == sum(summary[e] for e in ("completed", "abandoned", "refused"))
    [kill] = result["kills"]
    assert kill["deployment"] == DECODE and kill["replica"] is not None
    # The kill took the busiest decode replica; what it carried went on elsewhere.
    assert kill["carried"] >= 1 and result["migrated"] >= 1, (kill, result["migrated"])
    assert result["problems"] == []
    at_end = [row for row in result["replicas"] if row["live_at_end"]]
    assert sorted(row["deployment"] for row in at_end) == [DECODE, DECODE, PREFILL]
    assert all(row["free_blocks"] == row["num_blocks"] == SHARED_NUM_KV_BLOCKS for row in at_end)
    assert all(row["rss_end_bytes"] > 0 for row in at_end)
    killed = [row for row in result["replicas"] if row["killed"]]
    assert [row["replica"] for row in killed] == [kill["replica"]]
    assert killed[0]["rss_start_bytes"] > 0
    assert "| started | completed | abandoned | refused | failed | migrated | kills |" in run.stdout


def test_every_block_is_free_after_the_kills(cluster):
    _wait_for_two_decode_replicas()
    _wait(lambda: len(_pids(PREFILL)) == POOLS[PREFILL], "the prefill replica")
    wait_all_free(POOLS)
