"""Greedy streams a test reads in threads (HTTP or gRPC, through the session's Serve proxies), and
the decode replica to kill under them: for the tests of a replica dying mid-stream."""

import json
import os
import signal
import threading
import time
import urllib.request
from collections.abc import Callable

import grpc
from ray.util.state import list_actors

from pdserve.benchmarks.chaos_replicas import migrations
from pdserve.benchmarks.openai_http import token_ids
from pdserve.cluster.replicas import answering_replica_stats
from pdserve.cluster.serve import APP_NAME
from pdserve.router.api.grpc_service import pb, pb_grpc
from pdserve.router.api.sse import DONE_DATA
from pdserve.serving.config import ClusterConfig

WAIT_S = 120.0
POLL_S = 0.05


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


def http_stream(
    port: int, model: str, prompt: list[int], max_tokens: int, host: str = "127.0.0.1"
) -> Stream:
    """A greedy streamed completion of exactly ``max_tokens`` tokens, read as token ids."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "logprobs": 0,
        "stream": True,
        "ignore_eos": True,
        "return_tokens_as_token_ids": True,
    }

    def read(stream: Stream) -> None:
        request = urllib.request.Request(
            f"http://{host}:{port}/v1/completions",
            json.dumps(body).encode(),
            {"content-type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=WAIT_S) as response:
            for line in response:
                data = line.decode().removeprefix("data:").strip()
                if data == DONE_DATA:
                    return
                if not data:
                    continue
                event = json.loads(data)
                if "error" in event:  # the in-band error: the status line went out long ago
                    stream.error = event["error"]["message"]
                    return
                for choice in event["choices"]:
                    stream.tokens += token_ids((choice["logprobs"] or {}).get("tokens") or [])
        # A body closed cleanly but early (a proxy whose upstream died) reads like a short stream.
        stream.error = f"the stream ended without {DONE_DATA} after {len(stream.tokens)} tokens"

    return Stream(read)


def grpc_stream(port: int, model: str, prompt: list[int], max_tokens: int) -> Stream:
    """The same request over gRPC."""
    request = pb.GenerateRequest(
        model=model,
        token_ids=pb.TokenIds(ids=prompt),
        sampling_params=pb.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
    )

    def read(stream: Stream) -> None:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            responses = pb_grpc.GenerationStub(channel).Generate(
                request, metadata=(("application", APP_NAME),), timeout=WAIT_S
            )
            for response in responses:
                stream.tokens += response.token_ids

    return Stream(read)


def wait(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(POLL_S)


def replica_pids(deployment: str) -> dict[str, int]:
    """Each live replica's process id, by Serve replica id (the end of its actor name)."""
    actors = list_actors(filters=[("state", "=", "ALIVE")], limit=1000)
    return {
        actor.name.rsplit("#", 1)[-1]: actor.pid
        for actor in actors
        if actor.name and f"#{deployment}#" in actor.name
    }


def running_by_replica(deployment: str) -> dict[str, int]:
    """Requests running or waiting on each replica that answers: a killed one's successor may
    still be starting, and this process's handle may not know yet of one killed just now."""
    stats = answering_replica_stats(deployment)
    return {replica: s["num_running"] + s["num_waiting"] for replica, s in stats.items()}


def wait_for_replicas(deployment: str, count: int) -> None:
    """Until ``count`` replicas answer this process's handle, which learns of a new replica a
    moment after Serve."""
    wait(lambda: len(running_by_replica(deployment)) == count, f"{count} of {deployment}")


def kill_busiest(deployment: str) -> int:
    """SIGKILLs the replica with the most requests; returns how many it had."""
    running = running_by_replica(deployment)
    replica, busiest = max(running.items(), key=lambda item: item[1])
    assert busiest > 0, (running, replica_pids(deployment))
    os.kill(replica_pids(deployment)[replica], signal.SIGKILL)
    return busiest


def through_a_decode_kill(
    cluster: ClusterConfig, model: str, prompts: list[list[int]], max_tokens: int, kill_after: int
) -> tuple[list[Stream], int, int]:
    """Streams the prompts together (HTTP and gRPC in turn) and SIGKILLs the busiest decode
    replica once each stream has ``kill_after`` tokens; returns the streams, ended, with how many
    requests the killed replica carried and how many the router moved meanwhile.

    The gRPC streams start first and the HTTP ones once each gRPC stream has a token: a new gRPC
    channel through Serve's proxy took longer to its first token (over 0.7 s on two busy cores)
    than an HTTP stream of the tiny model took to its last."""
    ports = (cluster.http_port, cluster.grpc_port)
    streams = [
        (http_stream, grpc_stream)[i % 2](ports[i % 2], model, prompt, max_tokens)
        for i, prompt in enumerate(prompts)
    ]
    over_grpc = streams[1::2]
    before = migrations(model)
    for stream in over_grpc:
        stream.start()
    wait(lambda: all(s.tokens for s in over_grpc), "the gRPC streams' first tokens")
    for stream in streams[::2]:
        stream.start()
    wait(lambda: all(len(s.tokens) >= kill_after for s in streams), "the first tokens")
    assert all(len(s.tokens) < max_tokens for s in streams), "a stream ended before the kill"
    moved = kill_busiest(f"decode-{model}")
    for stream in streams:
        stream.join(WAIT_S)
    return streams, moved, migrations(model) - before
