"""The OpenAPI document holds under every check schemathesis has: its CLI runs ``--checks all``
against each local HTTP server (open, and one that asks for API keys) and must find nothing.

That is, for every operation of ``/openapi.json``: each answer has a documented status, content
type, headers and body (server-sent events included) and is never a server error; the requests
the document allows are served and the ones it forbids are refused with a 4xx; an undeclared
method is answered 405 with ``Allow``; a request without its key is refused 401. Every phase
that applies runs (the document's boundaries, then generated requests) with bounded examples,
deterministically, so the run is the same each time. ``openapi_hooks.py`` bounds each request's
work.
"""

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import schemathesis

from pdserve.tests.e2e.conftest import API_KEYS

OPERATIONS = ["GET /health", "GET /v1/models", "POST /v1/completions", "POST /v1/chat/completions"]
MAX_EXAMPLES = 20  # per operation and phase: both servers' runs take well under a minute
REQUEST_TIMEOUT_S = 30.0  # the tiny model on 2 busy cores
MAX_RESPONSE_S = 10.0  # the `max_response_time` check's limit: a bounded request takes < 1 s
RUN_TIMEOUT_S = 300.0
HOOKS = "pdserve.tests.e2e.openapi_hooks"
SERVERS = ["http_url", "keyed_http_url"]  # fixtures: the open server, the one with API keys
# The gateway in front of the router replicas answers these on any path (cluster/gateway.py).
GATEWAY_OVERLOADED, GATEWAY_UNAVAILABLE = "429", "503"


@pytest.fixture(params=SERVERS)
def server(request: pytest.FixtureRequest) -> tuple[str, list[str]]:
    """A server's URL and the CLI's arguments that authenticate to it (the keyed one: a
    valid key, which the ``ignored_auth`` check leaves out or spoils to see the 401)."""
    url = request.getfixturevalue(request.param)
    headers = (
        ["--header", f"Authorization: Bearer {API_KEYS[0]}"] if "keyed" in request.param else []
    )
    return url, headers


def test_the_document_has_these_operations(http_url: str) -> None:
    schema = schemathesis.openapi.from_url(f"{http_url}/openapi.json")
    assert [result.ok().label for result in schema.get_all_operations()] == OPERATIONS


def test_every_operation_lists_the_gateway_s_refusals(http_url: str) -> None:
    with urllib.request.urlopen(f"{http_url}/openapi.json", timeout=REQUEST_TIMEOUT_S) as answer:
        document = json.load(answer)
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            for status in (GATEWAY_OVERLOADED, GATEWAY_UNAVAILABLE):
                documented = operation["responses"][status]
                assert "Retry-After" in documented["headers"], (method, path, status)


def test_every_check_passes(server: tuple[str, list[str]], tmp_path: Path) -> None:
    url, auth = server
    command = [
        sys.executable, "-m", "schemathesis.cli", "run", f"{url}/openapi.json",
        "--checks", "all",
        "--max-examples", str(MAX_EXAMPLES),
        "--generation-deterministic",
        "--workers", "1",
        "--request-timeout", str(REQUEST_TIMEOUT_S),
        "--max-response-time", str(MAX_RESPONSE_S),
        "--output-sanitize", "false",  # it hides fields named like secrets: `max_tokens`
        "--no-color",
        *auth,
    ]  # fmt: skip
    run = subprocess.run(
        command,
        env={**os.environ, "SCHEMATHESIS_HOOKS": HOOKS},
        cwd=tmp_path,  # where the CLI keeps its cache
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert run.returncode == 0, run.stdout + run.stderr
