"""What ``pdserve`` answers at once, as a user runs it: its version, and ``pdserve serve`` on a
port something else holds, refused in one line before any Ray process starts."""

import importlib.metadata
import resource
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pdserve.cluster.cli import main
from pdserve.cluster.serve import free_port

# What a user waits for the one line, as the refusal's own CPU time: on a quiet machine that is its
# wall time (0.65 s on an AVX2 EPYC); beside make test's other runs on two cores, the wall time is
# the machine's load (2.5 s in CI), not the command's work.
REFUSAL_CPU_S = 2.0


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port some other server listens on."""
    with socket.socket() as server:
        server.bind(("0.0.0.0", free_port()))
        server.listen()
        yield server.getsockname()[1]


def test_version_is_the_package_s(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"pdserve {importlib.metadata.version('pdserve')}"


@pytest.mark.parametrize("flag", ["--port", "--grpc-port"])
def test_serve_on_a_busy_port_is_one_line_at_once(
    flag: str, held_port: int, tiny_model_dir: Path, tmp_path: Path
) -> None:
    other = "--grpc-port" if flag == "--port" else "--port"
    pdserve = Path(sys.executable).with_name("pdserve")
    argv = [str(pdserve), "serve", str(tiny_model_dir), flag, str(held_port)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [*argv, other, str(free_port())], cwd=tmp_path, capture_output=True, text=True
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    took = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert done.returncode == 1, done.stderr
    assert done.stdout == "" and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("pdserve: error: already in use:")
    assert f"port {held_port} ({flag})" in done.stderr
    assert took < REFUSAL_CPU_S, f"refused after {took:.1f} s of CPU time"
