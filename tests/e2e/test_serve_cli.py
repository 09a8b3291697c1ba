"""``pdserve serve`` as a user starts it: the default model (SmolLM2-135M-Instruct, or where its
wheel is missing the built-in tiny model), a streamed chat completion through its gateway, its
Prometheus (where the package is installed), Ctrl-C, and no Ray, HAProxy or Prometheus process
left behind. Free ports stand in for the default ones, which another program may hold, and Ray's
temp folder is one of its own (``ray_apart``), so these run beside the session's cluster."""

import shutil
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from pdserve.cluster.gateway import READY_PATH
from pdserve.cluster.serve import free_port
from pdserve.cluster.served_model import smollm2_gguf
from pdserve.tests.serve_process import EXIT_TIMEOUT_S, pdserve_serve, ray_apart

pytestmark = [pytest.mark.slow, pytest.mark.own_ray_cluster, pytest.mark.ray_apart]

DAEMONS = ("raylet", "gcs_server", "haproxy")  # Ray's and the gateway's
QUESTION = "What is the capital of France?"
MAX_TOKENS = 64  # SmolLM2 answers it in one sentence and stops
IGNORE_EOS = {"ignore_eos": True}  # the tiny model's random text runs to its length


def _daemon_pids(ray_env: dict[str, str]) -> set[int]:
    """Ray's and HAProxy's processes started by a ``pdserve serve`` with ``ray_env``: each has
    that environment (the session's cluster and the multihost tests' run meanwhile)."""
    mark = f"RAY_TMPDIR={ray_env['RAY_TMPDIR']}".encode()
    pids = set()
    for proc in Path("/proc").iterdir():
        try:
            if (
                proc.name.isdigit()
                and (proc / "comm").read_text().strip() in DAEMONS
                and mark in (proc / "environ").read_bytes().split(b"\0")
            ):
                pids.add(int(proc.name))
        except OSError:  # the process ended while we looked
            continue
    return pids


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def ray_env() -> Iterator[dict[str, str]]:
    with ray_apart() as env:
        yield env


def test_serve_answers_then_exits_cleanly(tmp_path: Path, ray_env: dict[str, str]) -> None:
    http_port = free_port()
    flags = ["--http-port", str(http_port), "--grpc-port", str(free_port())]
    prometheus_port = free_port() if shutil.which("prometheus") else None
    if prometheus_port is not None:
        flags += ["--prometheus", "--prometheus-port", str(prometheus_port)]
    real = smollm2_gguf() is not None
    # In tmp_path: without the wheel, the built-in model is made in ./models/tiny.
    with pdserve_serve(flags, tmp_path, env=ray_env) as log:
        printed = log.read_text().splitlines()
        assert _daemon_pids(ray_env), "no Ray or HAProxy process runs with the given environment"
        assert real or (tmp_path / "models" / "tiny" / "config.json").is_file()
        if prometheus_port is not None:
            url = f"http://127.0.0.1:{prometheus_port}"
            assert any(url in line for line in printed), printed
            with urllib.request.urlopen(f"{url}/-/ready", timeout=10) as ready:
                assert ready.status == 200

        assert any(line.split()[:2] == ["gateway:", "HAProxy,"] for line in printed), printed
        gateway = f"http://127.0.0.1:{http_port}{READY_PATH}"
        with urllib.request.urlopen(gateway, timeout=10) as ready:
            assert ready.status == 200  # HAProxy holds the port, a router replica behind it
        base_url = f"http://127.0.0.1:{http_port}/v1"
        with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0) as client:
            stream = client.chat.completions.create(
                model="SmolLM2-135M-Instruct" if real else "tiny",
                messages=[{"role": "user", "content": QUESTION}],
                max_tokens=MAX_TOKENS,
                temperature=0,
                stream=True,
                extra_body={} if real else IGNORE_EOS,
            )
            chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        if real:  # the README's answer, ended by the model's own end of turn
            assert "Paris" in text and "<|im_end|>" not in text, text
            assert chunks[-1].choices[0].finish_reason == "stop"
        else:
            assert text and chunks[-1].choices[0].finish_reason == "length"
    deadline = time.monotonic() + EXIT_TIMEOUT_S
    while (left := _daemon_pids(ray_env)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"Ray or HAProxy left running: {left}"
    assert prometheus_port is None or not _listening(prometheus_port), "Prometheus still runs"


def test_serve_takes_vllm_s_command_line(
    tmp_path: Path, tiny_model_dir: Path, ray_env: dict[str, str]
) -> None:
    """``pdserve serve MODEL --served-model-name --port --dtype --max-model-len``, as with vLLM."""
    http_port, max_model_len = free_port(), 256
    argv = [
        str(tiny_model_dir), "--served-model-name", "mine", "--port", str(http_port),
        "--grpc-port", str(free_port()), "--dtype", "bfloat16",
        "--max-model-len", str(max_model_len), "--prefill-replicas", "0",
    ]  # fmt: skip
    with pdserve_serve(argv, tmp_path, env=ray_env):
        base_url = f"http://127.0.0.1:{http_port}/v1"
        with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0) as client:
            (card,) = client.models.list().data
            assert (card.id, card.max_model_len) == ("mine", max_model_len)
            completion = client.completions.create(
                model="mine", prompt="The cache holds", max_tokens=4, extra_body=IGNORE_EOS
            )
            assert completion.choices[0].finish_reason == "length"
            with pytest.raises(openai.BadRequestError, match="maximum context length"):
                client.completions.create(model="mine", prompt="x", max_tokens=max_model_len)
