"""A helper program pdserve starts (HAProxy, Prometheus) ends with the process that started it."""

import ctypes
import signal

PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent dies (Linux)
# Loaded before any fork: the child only calls it.
_LIBC = ctypes.CDLL(None, use_errno=True)


def die_with_parent() -> None:
    """``preexec_fn`` of the child's ``Popen``: the kernel stops the child (SIGTERM) when the
    process that started it dies, however that one ends (a Ray driver whose cluster went away may
    be killed outright), so no helper outlives its starter."""
    _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
