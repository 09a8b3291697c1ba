"""``pdserve serve`` (or ``pdserve gateway``) as a user runs it: a process of its own, up once it
prints its Ctrl-C line, stopped with Ctrl-C, which it must answer by exiting 0."""

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

STARTUP_TIMEOUT_S = 240.0
EXIT_TIMEOUT_S = 60.0
POLL_S = 0.2


@contextmanager
def pdserve_serve(args: list[str], cwd: Path, verb: str = "serve") -> Iterator[Path]:
    """Runs ``pdserve VERB *args`` in ``cwd``; yields the file its output goes to (a file, not
    a pipe: a pipe nobody reads would fill and stall the server's logging)."""
    pdserve = Path(sys.executable).with_name("pdserve")
    log = cwd / f"pdserve-{verb}.log"
    with open(log, "w") as out:
        server = subprocess.Popen(
            [str(pdserve), verb, *args],
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
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
