"""A decode replica killed mid-stream (SIGKILL of its process): its requests go on at another
replica, and each client's stream, HTTP or gRPC, carries exactly the fault-free greedy tokens;
killed again beyond ``migration_limit``, a stream ends with the in-band error. A prefill replica
killed before a request, or while the request is inside its prefill call (held there by the
replica's test hook): the prompt prefills at its decode replica, to the same tokens. ``pdserve bench
chaos`` runs against it too (a decode kill, then the router's, streams abandoned): every accepted
stream ends whole or, held by the killed router replica, is cut with it; every completed one
equals the offline engine; every replica frees every block.

Router + 1 prefill + 2 decode replicas of the tiny model (the session's shared app, after
test_cluster's tests); Serve starts a new replica for each one killed, and the test waits for it
before going on.
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from ray import serve

from pdserve.benchmarks.chaos_replicas import migrations
from pdserve.cluster.replicas import answering_replica_stats
from pdserve.cluster.serve import APP_NAME
from pdserve.engine.llm import LLM
from pdserve.serving.config import ROUTER_DEPLOYMENT
from pdserve.tests.e2e.serve_replicas import (
    SHARED_MIGRATION_LIMIT,
    SHARED_MODEL,
    SHARED_NUM_KV_BLOCKS,
    SHARED_POOLS,
    offline_greedy,
    random_prompts,
    wait_all_free,
)
from pdserve.tests.e2e.streams import (
    WAIT_S,
    Stream,
    http_stream,
    kill_busiest,
    replica_pids,
    through_a_decode_kill,
    wait,
    wait_for_replicas,
)

pytestmark = pytest.mark.slow

MODEL, POOLS, MIGRATION_LIMIT = SHARED_MODEL, SHARED_POOLS, SHARED_MIGRATION_LIMIT
DECODE, PREFILL = f"decode-{MODEL}", f"prefill-{MODEL}"
FIRST_SEED = 100
# Long enough that a stream is still running when its replica is killed, and after it moved.
MAX_TOKENS = 240
TOKENS_BEFORE_KILL = 12
PROMPT_LENGTHS = [40, 300, 90, 500]  # short ones prefill at the decode replica, long remotely
# bench chaos: 4 streams for 13 s, a decode replica killed at 6 s and the router's at 12 s, some
# streams abandoned by the client (seed 0 abandons two); it exits well within CHAOS_TIMEOUT_S.
# Streams of ~2 s (480 tokens): with 48 (~0.2 s) the kill's pick (the replica's stats, then the
# kill) could outlast what it carried.
CHAOS_ARGS = ["--streams", "4", "--seconds", "13", "--kill-every", "6", "--kill", "decode,router"]
CHAOS_ARGS += ["--disconnect-fraction", "0.3", "--input-len", "32", "--output-len", "480"]
CHAOS_TIMEOUT_S = 300.0


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


def _http_stream(port: int, prompt: list[int]) -> Stream:
    return http_stream(port, MODEL, prompt, MAX_TOKENS)


def test_streams_of_a_killed_decode_replica_finish_elsewhere_with_the_same_tokens(cluster, offline):
    wait_for_replicas(DECODE, POOLS[DECODE])
    prompts = _prompts(seed=0)
    expected = _greedy(offline, prompts)
    streams, moved, migrated = through_a_decode_kill(
        cluster, MODEL, prompts, MAX_TOKENS, TOKENS_BEFORE_KILL
    )
    assert [s.error for s in streams] == [None] * len(streams)
    assert [s.tokens for s in streams] == expected
    assert migrated == moved


def test_a_stream_lost_beyond_the_migration_limit_ends_with_the_in_band_error(cluster):
    wait_for_replicas(DECODE, POOLS[DECODE])
    stream = _http_stream(cluster.http_port, _prompts(seed=1)[0])
    before = migrations(MODEL)
    stream.start()
    for kill in range(MIGRATION_LIMIT + 1):
        # Past the last kill's migration, and a few tokens from the replica it moved to.
        wait(lambda kill=kill: migrations(MODEL) - before == kill, "the migration")
        goal = len(stream.tokens) + TOKENS_BEFORE_KILL
        wait(lambda goal=goal: len(stream.tokens) >= goal or not stream.is_alive(), "tokens")
        assert stream.is_alive() and len(stream.tokens) < MAX_TOKENS, "it ended before the kill"
        assert kill_busiest(DECODE) == 1
    stream.join(WAIT_S)
    assert stream.error is not None and "migration_limit 1" in stream.error, stream.error
    assert migrations(MODEL) - before == MIGRATION_LIMIT


def test_a_killed_prefill_replica_leaves_its_prompts_to_the_decode_replicas(cluster, offline):
    prompts = _prompts(seed=2)[1::2]  # the long ones, which go remote while the pool is up
    expected = _greedy(offline, prompts)
    wait(lambda: len(replica_pids(PREFILL)) == POOLS[PREFILL], "the prefill replica")
    (pid,) = replica_pids(PREFILL).values()
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
    wait(lambda: len(answering_replica_stats(PREFILL)) == POOLS[PREFILL], "the prefill replica")
    (pid,) = replica_pids(PREFILL).values()
    prefill = serve.get_deployment_handle(PREFILL, app_name=APP_NAME)
    prefill.hold_prefills.remote(True).result()
    killed = False
    try:
        stream = _http_stream(cluster.http_port, prompt)
        stream.start()
        wait(lambda: _held_prefills() == 1, "the request inside the prefill call")
        os.kill(pid, signal.SIGKILL)
        killed = True
        stream.join(WAIT_S)
    finally:
        if not killed:
            prefill.hold_prefills.remote(False).result()
    assert stream.error is None and stream.tokens == expected


def test_bench_chaos_ends_every_stream_and_frees_every_block_after_decode_and_router_kills(
    cluster, ray_cluster, tiny_model_dir: Path, tmp_path: Path
):
    wait_for_replicas(DECODE, POOLS[DECODE])
    wait(lambda: len(replica_pids(PREFILL)) == POOLS[PREFILL], "the prefill replica")
    out = tmp_path / "chaos.json"
    argv = ["--url", f"http://127.0.0.1:{cluster.http_port}", "--address", ray_cluster.address]
    argv += ["--model", MODEL, "--tokenizer", str(tiny_model_dir), "--out", str(out), *CHAOS_ARGS]
    argv += ["--reference-model", str(tiny_model_dir)]
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
    endings = ("completed", "abandoned", "refused", "cut")
    assert summary["started"] == sum(summary[e] for e in endings)
    kill, router_kill = result["kills"]
    assert kill["deployment"] == DECODE and kill["replica"] is not None
    # The kill took the busiest decode replica; what it carried went on elsewhere.
    assert kill["carried"] >= 1 and result["migrated"] >= 1, (kill, result["migrated"])
    # The only router replica: every stream it held was cut with it, and no other.
    assert router_kill["deployment"] == ROUTER_DEPLOYMENT and router_kill["carried"] >= 1
    allowed = router_kill["carried"] + summary["cut_sent_during_a_kill"]
    assert summary["cut"] <= allowed, (summary, router_kill)
    assert result["greedy"] == {"checked": summary["completed"], "differ": 0}
    assert result["problems"] == []
    at_end = [row for row in result["replicas"] if row["live_at_end"]]
    assert sorted(row["deployment"] for row in at_end) == [DECODE, DECODE, PREFILL]
    assert all(row["free_blocks"] == row["num_blocks"] == SHARED_NUM_KV_BLOCKS for row in at_end)
    assert all(row["rss_end_bytes"] > 0 for row in at_end)
    killed = [row for row in result["replicas"] if row["killed"]]
    assert [row["replica"] for row in killed] == [kill["replica"]]
    assert killed[0]["rss_start_bytes"] > 0
    assert "| started | completed | abandoned | refused | cut | failed | migrated | kills |" in (
        run.stdout
    )


def test_every_block_is_free_after_the_kills(cluster):
    wait_for_replicas(DECODE, POOLS[DECODE])
    wait(lambda: len(replica_pids(PREFILL)) == POOLS[PREFILL], "the prefill replica")
    wait_all_free(POOLS)
