"""``pdserve serve`` (or ``pdserve gateway``) as a user runs it: a process of its own, up once it
prints its Ctrl-C line, stopped with Ctrl-C, which it must answer by exiting 0; and the setting
for one whose local Ray shares nothing with the test session's cluster (``ray_apart``)."""

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

STARTUP_TIMEOUT_S = 240.0
EXIT_TIMEOUT_S = 60.0
POLL_S = 0.2


@contextmanager
def ray_apart() -> Iterator[dict[str, str]]:
    """The environment of a ``pdserve serve`` whose new local Ray cluster can run beside the
    session's: its temp folder of its own (``/tmp/ray`` holds a cluster's files, its nodes'
    list for Prometheus among them; short, for Ray's socket paths) and its own auth token (Ray
    writes ``~/.ray/auth_token`` where none is: two clusters starting at once could each write
    theirs, and one would then refuse its own processes). Its processes inherit this environment."""
    folder = tempfile.mkdtemp(prefix="ray-apart-", dir="/tmp")
    try:
        yield {"RAY_TMPDIR": folder, "TMPDIR": folder, "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def pdserve_serve(
    args: list[str], cwd: Path, verb: str = "serve", env: dict[str, str] | None = None
) -> Iterator[Path]:
    """Runs ``pdserve VERB *args`` in ``cwd`` (``env`` added to this process's environment);
    yields the file its output goes to (a file, not a pipe: a pipe nobody reads would fill and
    stall the server's logging)."""
    pdserve = Path(sys.executable).with_name("pdserve")
    log = cwd / f"pdserve-{verb}.log"
    with open(log, "w") as out:
        server = subprocess.Popen(
            [str(pdserve), verb, *args],
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while "Ctrl-C stops" not in log.read_text():
            assert server.poll() is None, f"pdserve {verb} exited early:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"pdserve {verb} not up:\n{log.read_text()[-3000:]}"
            time.sleep(POLL_S)
        yield log
    finally:
        server.send_signal(signal.SIGINT)
        returncode = server.wait(timeout=EXIT_TIMEOUT_S)
    assert returncode == 0, log.read_text()[-3000:]
