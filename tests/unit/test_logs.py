"""A replica's pdserve lines (serving/logs.py), without Ray: each record reaches the console and
Serve's file at once, at its level, with one formatted traceback, behind what Serve's buffer held;
a released KV export whose pull never started connects to its owner first (NIXL has no route to
an owner it was never told of)."""

import io
import logging
import logging.handlers
from collections.abc import Iterator
from pathlib import Path

import pytest

from pdserve.kvtransfer.engine_hooks import PeerPull
from pdserve.serving import logs

BUFFER = 1000  # Serve's request-path buffer in its throughput mode


@pytest.fixture
def serve_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A replica's ``ray.serve`` logger as Serve's throughput mode sets it up: its file behind a
    1,000-record buffer, and no console."""
    path = tmp_path / "replica_pdserve_router_abc.log"
    target = logging.FileHandler(path)
    target.setFormatter(logging.Formatter("%(levelname)s %(name)s -- %(message)s"))
    buffer = logging.handlers.MemoryHandler(BUFFER, logging.ERROR, target)
    serve_logger = logging.getLogger(logs.SERVE_LOGGER)
    monkeypatch.setattr(serve_logger, "handlers", [buffer])
    monkeypatch.setattr(serve_logger, "level", logging.INFO)  # LoggingConfig's default
    yield path
    target.close()


@pytest.fixture
def pdserve_logger(monkeypatch: pytest.MonkeyPatch) -> logging.Logger:
    """The ``pdserve`` logger, restored after the test (``log_replica_lines`` changes it)."""
    logger = logging.getLogger(logs.PDSERVE_LOGGER)
    monkeypatch.setattr(logger, "handlers", [])
    monkeypatch.setattr(logger, "propagate", logger.propagate)
    monkeypatch.setattr(logger, "level", logger.level)
    return logger


def _fail() -> None:
    raise ValueError("bad value")


def test_a_warning_reaches_the_console_and_serve_s_file_at_once_with_one_traceback(
    serve_file: Path,
) -> None:
    console = io.StringIO()
    logger = logging.getLogger("pdserve.test-logs")
    logger.addHandler(logs.ReplicaLogHandler(console))
    logging.getLogger(logs.SERVE_LOGGER).info("GET /v1/models 200 1.0ms")  # an access line
    try:
        try:
            _fail()
        except ValueError:
            logger.warning("could not do it", exc_info=True)
    finally:
        logger.handlers.clear()
    printed = console.getvalue()
    assert printed.startswith("WARNING ") and "pdserve.test-logs: could not do it\n" in printed
    assert printed.count("Traceback (most recent call last):") == 1
    assert printed.rstrip().endswith("ValueError: bad value")
    lines = serve_file.read_text().splitlines()
    # Serve's buffered line first: the file keeps its order.
    assert lines[:2] == [
        "INFO ray.serve -- GET /v1/models 200 1.0ms",
        "WARNING pdserve.test-logs -- could not do it",
    ]
    assert lines[2] == "Traceback (most recent call last):" and lines[-1] == "ValueError: bad value"


def test_serve_s_own_console_handler_is_not_written_twice(serve_file: Path) -> None:
    serve_console = io.StringIO()
    serve_logger = logging.getLogger(logs.SERVE_LOGGER)
    serve_logger.handlers.append(logging.StreamHandler(serve_console))
    console = io.StringIO()
    record = logging.LogRecord("pdserve.test", logging.WARNING, __file__, 0, "once", None, None)
    logs.ReplicaLogHandler(console).handle(record)
    assert serve_console.getvalue() == "" and "once" in console.getvalue()
    assert "once" in serve_file.read_text()


def test_log_replica_lines_sets_up_once_at_serve_s_level_and_stops_at_pdserve(
    serve_file: Path, pdserve_logger: logging.Logger, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logging.getLogger(logs.SERVE_LOGGER), "level", logging.WARNING)
    logs.log_replica_lines()
    logs.log_replica_lines()
    (handler,) = pdserve_logger.handlers
    assert isinstance(handler, logs.ReplicaLogHandler)
    assert pdserve_logger.level == logging.WARNING and not pdserve_logger.propagate


class _Connector:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def add_peer(self, info: object) -> None:
        self.calls.append("add_peer")

    def release(self, export: object) -> None:
        self.calls.append("release")


def test_a_release_without_a_pull_connects_to_the_owner_first() -> None:
    connector = _Connector()
    PeerPull(connector, owner=object(), export=object(), first_token=0).release()
    assert connector.calls == ["add_peer", "release"]
