"""``pdserve serve`` as a user starts it: no arguments, a streamed chat completion, Ctrl-C, and
no Ray process left behind."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest

from pdserve.serving.config import DEFAULT_HTTP_PORT

pytestmark = pytest.mark.slow

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


def test_serve_with_no_arguments_answers_then_exits_cleanly(tmp_path: Path) -> None:
    before = _ray_daemon_pids()
    pdserve = Path(sys.executable).with_name("pdserve")
    server = subprocess.Popen(
        [str(pdserve), "serve"],
        cwd=tmp_path,  # the built-in model is made in ./models/tiny
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        for line in server.stdout:
            if "Ctrl-C" in line:
                break
            assert time.monotonic() < deadline, "pdserve serve did not come up in time"
        else:
            raise AssertionError(f"pdserve serve exited early with {server.wait()}")
        assert (tmp_path / "models" / "tiny" / "config.json").is_file()

        base_url = f"http://127.0.0.1:{DEFAULT_HTTP_PORT}/v1"
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
