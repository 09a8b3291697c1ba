"""Where a replica's own lines go (its stats line, the planner's decisions): stderr, at INFO.

Ray keeps each worker's stderr in the session's ``logs/worker-*.err`` and shows it on the
driver's terminal (``pdserve serve``'s). Serve's own ``ray.serve`` logger would not do: in its
throughput mode (``cluster/serve_env.py``) it writes only to the replica's file, through a
1,000-record buffer, so a line every 10 s would wait hours to appear.
"""

import logging
import sys

REPLICA_LOGGER = "pdserve.replica"

_logger = logging.getLogger(REPLICA_LOGGER)
_handler = logging.StreamHandler(sys.stderr)
_handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s %(message)s"))
_logger.addHandler(_handler)
_logger.setLevel(logging.INFO)
_logger.propagate = False


def replica_logger() -> logging.Logger:
    return _logger
