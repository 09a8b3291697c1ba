"""``pdserve serve`` as a user starts it: the built-in model, a streamed chat completion, its
Prometheus (where the package is installed), Ctrl-C, and no Ray or Prometheus process left behind.
Free ports stand in for the default ones, which another program may hold."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import openai
import pytest

from pdserve.cluster.serve import free_port

pytestmark = [pytest.mark.slow, pytest.mark.own_ray_cluster]

STARTUP_TIMEOUT_S = 240.0
EXIT_TIMEOUT_S = 60.0
RAY_DAEMONS = ("raylet", "gcs_server")


def _ray_daemon_pids() -> set[int]:
    pids = set()
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (proc / "comm").read_text().strip() in RAY_DAEMONS:
                pids.add(int(proc.name))
        except OSError:  # the process ended while we looked
            continue
    return pids


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_serve_answers_then_exits_cleanly(tmp_path: Path) -> None:
    before = _ray_daemon_pids()
    pdserve = Path(sys.executable).with_name("pdserve")
    http_port = free_port()
    flags = ["--http-port", str(http_port), "--grpc-port", str(free_port())]
    prometheus_port = free_port() if shutil.which("prometheus") else None
    if prometheus_port is not None:
        flags += ["--prometheus", "--prometheus-port", str(prometheus_port)]
    server = subprocess.Popen(
        [str(pdserve), "serve", *flags],
        cwd=tmp_path,  # the built-in model is made in ./models/tiny
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        deadline, printed = time.monotonic() + STARTUP_TIMEOUT_S, []
        for line in server.stdout:
            printed.append(line)
            if "Ctrl-C" in line:
                break
            assert time.monotonic() < deadline, "pdserve serve did not come up in time"
        else:
            raise AssertionError(f"pdserve serve exited early with {server.wait()}")
        assert (tmp_path / "models" / "tiny" / "config.json").is_file()
        if prometheus_port is not None:
            url = f"http://127.0.0.1:{prometheus_port}"
            assert any(url in line for line in printed), printed
            with urllib.request.urlopen(f"{url}/-/ready", timeout=10) as ready:
                assert ready.status == 200

        base_url = f"http://127.0.0.1:{http_port}/v1"
        with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0) as client:
            stream = client.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": "Hello there"}],
                max_tokens=6,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            chunks = list(stream)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert chunks[-1].choices[0].finish_reason == "length"
    finally:
        server.send_signal(signal.SIGINT)
        returncode = server.wait(timeout=EXIT_TIMEOUT_S)
    assert returncode == 0
    deadline = time.monotonic() + EXIT_TIMEOUT_S
    while (left := _ray_daemon_pids() - before) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"Ray daemons left running: {left}"
    assert prometheus_port is None or not _listening(prometheus_port), "Prometheus still runs"
