"""``deploy/serve.yaml`` deployed for real with Serve's own CLI (``serve run``) on the session's
cluster, answering a request. Only what ties the file to this machine changes: the proxies' ports
(the session's Serve has its own) and the model's path (absolute, to the session's tiny model)."""

import os
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest
import yaml
from ray import serve

from pdserve.cluster.serve import APP_NAME
from pdserve.cluster.serve_env import SERVE_ENV

pytestmark = pytest.mark.slow

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
TIMEOUT_S = 240
POLL_S = 0.5


def _status() -> str:
    app = serve.status().applications.get(APP_NAME)
    return "NOT_STARTED" if app is None else app.status  # a str enum


def test_serve_run_deploys_serve_yaml_and_it_answers(ray_cluster, tiny_model_dir, tmp_path):
    config = yaml.safe_load((DEPLOY / "serve.yaml").read_text())
    config["http_options"] = {"host": "127.0.0.1", "port": ray_cluster.http_port}
    config["grpc_options"]["port"] = ray_cluster.grpc_port
    [app] = config["applications"]
    [model] = app["args"]["models"]
    model["path"] = str(tiny_model_dir)
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump(config))
    serve_cli = Path(sys.executable).with_name("serve")
    run = subprocess.run(
        [str(serve_cli), "run", "--non-blocking", "--address", ray_cluster.address, str(path)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env={**os.environ, **SERVE_ENV},
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while (status := _status()) != "RUNNING":
            assert status in ("NOT_STARTED", "DEPLOYING"), status
            assert time.monotonic() < deadline, status
            time.sleep(POLL_S)
        base_url = f"http://127.0.0.1:{ray_cluster.http_port}/v1"
        with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0) as client:
            response = client.completions.create(
                model=model["name"], prompt="The cache holds", max_tokens=5
            )
        assert response.usage.completion_tokens == 5
        assert response.choices[0].text
    finally:
        serve.delete(APP_NAME)
