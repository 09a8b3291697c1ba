"""The two servers ``bench peers`` drives, each a process of its own started here and stopped at
the end: llama.cpp's ``llama-server`` and ``pdserve serve`` (its own local Ray cluster), both on
the same GGUF file and the same cores, both answering the OpenAI API on 127.0.0.1."""

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import yaml

from pdserve.cluster.readiness import wait_ready

READY_POLL_S = 1.0
STOP_GRACE_S = 60.0  # pdserve stops its Ray cluster on SIGINT


def pdserve_config(
    gguf: Path, name: str, port: int, grpc_port: int, cores: int, quantization: str | None
) -> dict:
    """One model served aggregated (a decode replica prefills its own prompts) by one replica
    given ``cores`` cores, as llama.cpp's single process is; the engine's defaults otherwise.
    ``quantization``: the engine's (int8 for a Q8_0 file keeps its blocks as they are)."""
    engine = {"dtype": "float32"} | ({"quantization": quantization} if quantization else {})
    return {
        "http_port": port,
        "grpc_port": grpc_port,
        "http_host": "127.0.0.1",
        "models": [
            {
                "name": name,
                "path": str(gguf),
                "engine": engine,
                "prefill": {"replicas": 0},
                "decode": {"replicas": 1, "num_cpus": cores},
            }
        ],
    }


def pdserve_argv(config: dict, folder: Path) -> list[str]:
    path = folder / "pdserve-peers.yaml"
    path.write_text(yaml.safe_dump(config))
    return [str(Path(sys.executable).with_name("pdserve")), "serve", "--config", str(path)]


@contextlib.contextmanager
def running(argv: list[str], url: str, log: Path, timeout_s: float) -> Iterator[None]:
    """The server ``argv`` starts, once ``url``/health answers 200; its output goes to ``log``.
    Stopped on leaving (SIGINT, then SIGKILL to its process group after ``STOP_GRACE_S``)."""
    with log.open("w") as out:
        process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        wait_ready(process, Path(argv[0]).name, url + "/health", log, timeout_s, READY_POLL_S)
        yield
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
