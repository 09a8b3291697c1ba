"""Logs where an operator looks: a warning the router replica logs while the cluster runs is, within
seconds, in that replica's Serve log file (``logs/serve/replica_pdserve_router_<id>.log``) and on
the driver's console, where Ray shows each replica's stderr, at WARNING under its logger's name
(the session's shared app: router + 1 prefill + 2 decode replicas of the tiny model)."""

import json
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from pdserve.tests.e2e.serve_replicas import SHARED_MODEL

pytestmark = pytest.mark.timeout(240)  # with a cold start of the session cluster and app

# The file has the line at once and the console a fraction of a second later (README, Logs); Ray's
# forwarding to the driver takes seconds while replicas start on two busy cores.
WAIT_S = 10.0
POLL_S = 0.1
LOGGER = "pdserve.router.api.openai_requests"


def _complete(port: int, body: dict) -> None:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        json.dumps(body).encode(),
        {"content-type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 200


def _lines_with(text: str, paths: list[Path]) -> list[str]:
    return [line for path in paths for line in path.read_text().splitlines() if text in line]


def test_an_unknown_request_field_is_warned_about_in_the_router_s_file_and_on_the_console(
    shared_app, ray_cluster, capfd: pytest.CaptureFixture[str]
) -> None:
    field = f"log_probe_{uuid.uuid4().hex[:8]}"  # this test's own: no other line has it
    body = {"model": SHARED_MODEL, "prompt": "hi", "max_tokens": 1, field: 1}
    _complete(shared_app.http_port, body)
    warning = f"ignoring unknown request fields: {field}"
    deadline = time.monotonic() + WAIT_S
    console = ""
    while True:
        captured = capfd.readouterr()
        console += captured.out + captured.err
        router_files = list((ray_cluster.log_dir / "serve").glob("replica_*_router_*.log"))
        in_file = _lines_with(warning, router_files)
        on_console = [line for line in console.splitlines() if warning in line]
        if (in_file and on_console) or time.monotonic() > deadline:
            break
        time.sleep(POLL_S)
    assert len(in_file) == 1, f"not in the router's log file ({router_files}) within {WAIT_S} s"
    assert in_file[0].startswith("WARNING ") and LOGGER in in_file[0], in_file
    assert len(on_console) == 1, f"not on the console within {WAIT_S} s"
    assert "WARNING" in on_console[0] and LOGGER in on_console[0], on_console
