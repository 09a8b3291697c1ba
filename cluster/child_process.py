"""A helper program pdserve starts (HAProxy, Prometheus) ends with the process that started it."""

import logging
import shutil

logger = logging.getLogger(__name__)


def dying_with_parent(argv: list[str]) -> list[str]:
    """``argv`` started through util-linux's ``setpriv --pdeathsig``: the kernel stops the helper
    (SIGTERM) when the thread that started it dies, however that one ends (a Ray driver whose
    cluster went away may be killed outright), so no helper outlives its starter.

    Not a ``preexec_fn`` (the same ``prctl`` run between fork and exec): in a process with threads
    that is unsafe, and with gRPC's running (Ray's, a test's server) its fork handlers aborted the
    child before the exec (SIGABRT, "epoll_wait error: Bad file descriptor"); without one,
    ``Popen`` execs straight from a vfork, where no fork handler runs."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        logger.warning("no setpriv (util-linux): %s may outlive this process", argv[0])
        return argv
    return [setpriv, "--pdeathsig", "TERM", "--", *argv]
