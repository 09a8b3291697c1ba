"""The SLA planner on a real cluster and a real Prometheus, started by ``pdserve serve --config``:
a rising load grows both pools, the end of it shrinks them back, and every stream meanwhile
completes with the offline engine's tokens.

The model is profiled for real (``pdserve profile``, a small grid), and the profile sets the load,
the targets and the decode replicas' room, so that a fast CPU is loaded as much as a slow one: the
calm phase fills a tenth of one prefill replica's time, the loaded phase 85% of it (512-token
prompts, 64 tokens out), where the TTFT target (1.5 prompts' prefill) wants a second prefill
replica, and a decode replica runs at most three quarters of the requests the loaded phase keeps
decoding at a lone request's step (``max_num_seqs``), so the decode pool wants a second one too;
each pool may have 1 to 3. (A decode step's time grows little with its batch on a CPU with wide
vectors: there, a decode replica without that bound would meet the ITL target at any load a prefill
replica can feed.)
"""

import math
import re
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
import torch
import yaml
from ray import serve

from pdserve.benchmarks.openai_http import token_ids
from pdserve.cluster import cli
from pdserve.cluster.planner.profile import Profile
from pdserve.cluster.serve import APP_NAME, free_port
from pdserve.engine.llm import LLM
from pdserve.engine.sampling_params import SamplingParams
from pdserve.tests.serve_process import pdserve_serve

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("prometheus") is None,
        reason="needs the prometheus binary: Debian package `prometheus` (make test installs it)",
    ),
]

MODEL = "planner-tiny"  # a name of its own: the cluster may export other modules' series
INTERVAL_S = 5.0
PROMPT_LEN, MAX_TOKENS = 512, 64
# (share of one prefill replica's time, seconds): two intervals calm, three loaded.
RAMP = [(0.1, 10.0), (0.85, 15.0)]
# One prefill replica at 85% queues a prompt for 2.8 prefills' time (M/D/1): the TTFT target
# missed, on any CPU; two replicas meet it.
TTFT_PREFILLS, ITL_STEPS = 1.5, 2.0
DECODE_ROOM = 0.75  # a decode replica's max_num_seqs, over the loaded phase's decode batch
SHRINK_TIMEOUT_S = 150.0
DECISIONS_AFTER_RAMP = 4  # intervals to wait, after the ramp, for the decisions it is judged by
WATCH_S = 0.5


@pytest.fixture(scope="module")
def profile(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("profile") / "profile.json"
    argv = ["profile", "--model", str(tiny_model_dir), "--out", str(path), "--threads", "1"]
    argv += ["--prefill-tokens", "16", "128", "512", "--decode-batches", "1", "4", "16"]
    assert cli.main([*argv, "--decode-contexts", "128", "576"]) == 0
    return path


@dataclass(frozen=True)
class Load:
    """The ramp and the targets, in this machine's time (from its profile)."""

    ramp: list[tuple[float, float]]  # (requests/s, seconds)
    ttft_ms: float
    itl_ms: float
    max_num_seqs: int  # a replica's room


@pytest.fixture(scope="module")
def load(profile: Path) -> Load:
    measured = Profile.load(profile)
    prefill_s = measured.prefill_seconds(PROMPT_LEN)
    step_s = measured.decode_step_seconds(1, PROMPT_LEN + MAX_TOKENS / 2)
    ramp = [(share / prefill_s, seconds) for share, seconds in RAMP]
    batch = ramp[-1][0] * MAX_TOKENS * step_s  # Little's law, at a lone request's step
    return Load(
        ramp=ramp,
        ttft_ms=TTFT_PREFILLS * prefill_s * 1e3,
        itl_ms=ITL_STEPS * step_s * 1e3,
        max_num_seqs=math.ceil(DECODE_ROOM * batch),
    )


@pytest.fixture(scope="module")
def cluster(ray_cluster, tiny_model_dir: Path, profile: Path, load: Load, tmp_path_factory):
    """``pdserve serve --config`` with the planner on, as an operator runs it on a cluster that is
    up (the session's); the planner reads the Prometheus that ``pdserve serve`` starts."""
    pool = {"replicas": 1, "min_replicas": 1, "max_replicas": 3}
    model = {
        "name": MODEL,
        "path": str(tiny_model_dir),
        "engine": {"num_kv_blocks": 2048, "max_num_seqs": load.max_num_seqs},
        "prefill": pool,
        "decode": pool,
        "routing": {"local_prefill_max_tokens": 64},
        "sla": {"ttft_ms": load.ttft_ms, "itl_ms": load.itl_ms},
    }
    planner = {"enabled": True, "interval_s": INTERVAL_S, "profile": str(profile)}
    config = ray_cluster.config([model], planner=planner)
    workdir = tmp_path_factory.mktemp("planner")
    path = workdir / "cluster.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    args = ["--config", str(path), "--address", ray_cluster.address]
    with pdserve_serve([*args, "--prometheus-port", str(free_port())], workdir):
        yield config


def _replicas(states: tuple[str, ...] = ("RUNNING",)) -> dict[str, int]:
    """Each pool's replicas in ``states``."""
    deployments = serve.status().applications[APP_NAME].deployments
    return {
        pool: sum(deployments[f"{pool}-{MODEL}"].replica_states.get(s, 0) for s in states)
        for pool in ("prefill", "decode")
    }


@pytest.fixture
def peak(cluster) -> Iterator[dict[str, int]]:
    """The most replicas each pool had at once, all through the test: running, or started by
    Serve on the planner's word (on two busy cores a replica may take longer to load than the
    load lasts)."""
    most, done = {"prefill": 0, "decode": 0}, threading.Event()

    def watch() -> None:
        while not done.is_set():
            for pool, count in _replicas(("STARTING", "RUNNING")).items():
                most[pool] = max(most[pool], count)
            time.sleep(WATCH_S)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    yield most
    done.set()
    watcher.join()


def _missed(line: str, load: Load) -> bool:
    """Whether a decision's line saw the model miss a target."""
    seen = re.search(r"TTFT (-|[\d.]+)(?: ms)?, ITL (-|[\d.]+)", line)
    ttft, itl = seen.groups()
    return (ttft != "-" and float(ttft) > load.ttft_ms) or (itl != "-" and float(itl) > load.itl_ms)


def _history() -> list[str]:
    return serve.get_app_handle(APP_NAME).planner_history.remote().result()


def test_a_rising_load_grows_both_pools_and_its_end_shrinks_them(
    cluster, tiny_model_dir: Path, load: Load, peak: dict[str, int]
) -> None:
    # Every prompt new, so no prefix cache makes the load lighter than it looks.
    generator = torch.Generator().manual_seed(7)
    num_prompts = int(sum(rate * seconds for rate, seconds in load.ramp)) + len(load.ramp)
    prompts = [
        torch.randint(0, 4096, (PROMPT_LEN,), generator=generator).tolist()
        for _ in range(num_prompts)
    ]
    base_url = f"http://127.0.0.1:{cluster.http_port}/v1"
    results, errors = [], []
    lock = threading.Lock()

    def one(i: int) -> None:
        try:
            with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0) as client:
                response = client.completions.create(
                    model=MODEL,
                    prompt=prompts[i],
                    max_tokens=MAX_TOKENS,
                    temperature=0,
                    logprobs=0,
                    extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True},
                )
            got = token_ids(response.choices[0].logprobs.tokens)
            with lock:
                results.append((i, got))
        except Exception as error:  # every stream must complete: collected and asserted below
            with lock:
                errors.append(repr(error))

    # The decisions made before the loaded phase: an interval is judged loaded by when it ended,
    # not by the rate it saw (on two busy cores the client and router may send less than asked).
    threads, sent, calm_decisions = [], 0, 0
    for phase, (rate, seconds) in enumerate(load.ramp):
        if phase == len(load.ramp) - 1:
            calm_decisions = len(_history())
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            thread = threading.Thread(target=one, args=(sent,))
            thread.start()
            threads.append(thread)
            sent += 1
            time.sleep(1.0 / rate)
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors[:3]
    assert len(results) == sent
    # Both pools grow within two intervals of the first loaded interval that missed a target.
    # The planner's decisions trail the load: wait for that interval and the two after it.
    deadline = time.monotonic() + DECISIONS_AFTER_RAMP * INTERVAL_S
    while True:
        history = _history()
        loaded = enumerate(history[calm_decisions:], start=calm_decisions)
        missed = next((i for i, line in loaded if _missed(line, load)), None)
        if (missed is not None and len(history) > missed + 2) or time.monotonic() > deadline:
            break
        time.sleep(WATCH_S)
    assert missed is not None, history
    for pool in ("prefill", "decode"):
        grown = next((i for i, line in enumerate(history) if f"{pool} 1 -> 2" in line), None)
        assert grown is not None and grown <= missed + 2, "\n".join([pool, str(missed), *history])
    deadline = time.monotonic() + SHRINK_TIMEOUT_S
    # The offline engine's tokens, made while the planner waits to shrink the pools.
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    expected = [o.token_ids for o in LLM(str(tiny_model_dir)).generate(prompts[:sent], params)]
    for i, got in results:
        assert got == expected[i], f"request {i}"
    while (now := _replicas()) != {"prefill": 1, "decode": 1}:
        assert time.monotonic() < deadline, (now, _history()[-6:])
        time.sleep(1.0)
    assert peak["prefill"] >= 2 and peak["decode"] >= 2, (peak, _history())
