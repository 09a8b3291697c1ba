"""Where a replica's pdserve lines go: at once, at their level, to the console and to the
replica's Serve log file.

Serve's ``ray.serve`` logger writes each replica's file (``logs/serve/replica_<app>_<deployment>_
<id>.log``). In its throughput mode (``cluster/serve_env.py``) that logger holds records in a
1,000-record buffer and takes over the replica's stdout and stderr at INFO, so a pdserve warning
left to Python's defaults reached the file only once 1,000 records had gathered, if ever, split
into INFO lines, and never the console. ``log_replica_lines`` sends the ``pdserve`` loggers
through ``ReplicaLogHandler`` instead: each record goes to the process's own stderr, which Ray
keeps in ``logs/worker-*.err`` and shows on the driver's console (``pdserve serve``'s), and to
Serve's file, whose buffer it flushes behind it so that the file keeps its order. Serve's access
lines stay buffered.
"""

import logging
import sys
from typing import TextIO

PDSERVE_LOGGER = "pdserve"
SERVE_LOGGER = "ray.serve"  # Serve's logger, by its documented name
CONSOLE_FORMAT = "%(levelname)s %(asctime)s %(name)s: %(message)s"
# Serve's line format plus the logger's name, for every deployment's ``logging_config``.
SERVE_LOGGING_CONFIG = {"additional_log_standard_attrs": ["name"]}


class ReplicaLogHandler(logging.Handler):
    """Writes each record to ``console`` and through Serve's own file handlers, flushed."""

    def __init__(self, console: TextIO) -> None:
        super().__init__()
        self._console = logging.StreamHandler(console)
        self._console.setFormatter(logging.Formatter(CONSOLE_FORMAT))

    def emit(self, record: logging.LogRecord) -> None:
        self._console.handle(record)
        for handler in logging.getLogger(SERVE_LOGGER).handlers:
            if _writes_console(handler):  # the console has the record already
                continue
            handler.handle(record)
            handler.flush()


def _writes_console(handler: logging.Handler) -> bool:
    return isinstance(handler, logging.StreamHandler) and not isinstance(
        handler, logging.FileHandler
    )


def log_replica_lines() -> None:
    """Called first thing in a replica's constructor, when Serve has set up its logger: from
    then on pdserve's records reach the console and the replica's file at once, at the level
    of the deployment's ``logging_config`` (Serve's; INFO by default). Once per process."""
    logger = logging.getLogger(PDSERVE_LOGGER)
    if any(isinstance(handler, ReplicaLogHandler) for handler in logger.handlers):
        return
    # Serve swaps sys.stderr for a writer into its buffered logger; the process's own is kept.
    logger.addHandler(ReplicaLogHandler(sys.__stderr__))
    logger.setLevel(logging.getLogger(SERVE_LOGGER).level or logging.INFO)
    logger.propagate = False  # a root handler would write to Serve's swapped stderr
