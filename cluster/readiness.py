"""A server this process started (the planner's Prometheus, the gateway's HAProxy, the two
servers of ``bench peers``): waiting until it answers its readiness URL, exits, or runs out of
time; and ending it."""

import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

ANSWER_TIMEOUT_S = 1.0  # one readiness call, on loopback


def wait_ready(
    process: subprocess.Popen, name: str, url: str, log: Path, timeout_s: float, poll_s: float
) -> None:
    """Returns once ``url`` answers 2xx. Raises ``RuntimeError`` with the text of ``log`` (where
    the process writes) if it exits first, ``TimeoutError`` past ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            output = log.read_text(errors="replace")
            raise RuntimeError(f"{name} exited ({process.returncode}):\n{output}")
        try:
            with urllib.request.urlopen(url, timeout=ANSWER_TIMEOUT_S):
                return
        except (urllib.error.URLError, OSError):
            time.sleep(poll_s)
    raise TimeoutError(f"{name} was not ready at {url} after {timeout_s:.0f} s")


def end(process: subprocess.Popen, timeout_s: float) -> None:
    """Asks ``process`` to end (SIGTERM), kills it past ``timeout_s``, and reaps it."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
