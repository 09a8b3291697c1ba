"""The one place NIXL is imported: a plain ``nixl`` module where present, else the PyPI wheel.

On PyPI NIXL installs as ``nixl_cu12``; its agent and config live in ``nixl_cu12._api``. When
neither imports, ``nixl_agent`` is None and ``IMPORT_ERROR`` says why, for the fallback's log line.
This is also the one place that reaches NIXL's private binding (``_api.nixlBind``, in
``make_agent``, and its exception classes' names, in ``MEANINGS``); ``tests/unit/test_nixl_shim.py``
touches what it uses.
"""

import contextlib
import threading
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from pdserve.kvtransfer.handles import KVTransferError

__all__ = [
    "IMPORT_ERROR",
    "MEANINGS",
    "NIXL_VERSION",
    "TRANSFER_FAILED",
    "explained",
    "make_agent",
    "nixl_agent",
    "nixl_agent_config",
    "nixl_available",
]

NIXL_VERSION = "1.5.1"  # the one this module was written and tested against

nixl_agent: Any = None
nixl_agent_config: Any = None
IMPORT_ERROR: str | None = None
_api: ModuleType | None = None

try:
    from nixl import _api
    from nixl._api import nixl_agent, nixl_agent_config
except ImportError:
    try:
        from nixl_cu12 import _api
        from nixl_cu12._api import nixl_agent, nixl_agent_config
    except ImportError as error:  # the wheel is missing, or its native libraries failed to load
        IMPORT_ERROR = f"{type(error).__name__}: {error}"

_config_swap = threading.Lock()

_MISUSE = "NIXL refused the call (a pdserve bug: please report this line)"
# What each error NIXL's binding raises (by its class's name) means to an operator; NIXL's C++
# prints its own line on stderr first, which names only the call.
MEANINGS = {
    "nixlNotFoundError": "this replica's NIXL agent has no connection to the peer (not made yet,"
    " or the peer has gone)",
    "nixlRemoteDisconnectError": "the peer's process has gone (its replica stopped or was killed)",
    "nixlBackendError": "UCX could not reach the peer or move the bytes (UCX may have printed"
    " why above)",
    "nixlCancelledError": "the transfer was cancelled",
    "nixlMismatchError": "the peer's NIXL metadata differs from the one loaded for its name",
    "nixlInvalidParamError": _MISUSE,
    "nixlNotAllowedError": _MISUSE,
    "nixlNotSupportedError": _MISUSE,
    "nixlNotPostedError": _MISUSE,
    "nixlRepostActiveError": _MISUSE,
}
TRANSFER_FAILED = "UCX failed the transfer (the peer's process gone, or its connection lost)"


def nixl_available() -> bool:
    return nixl_agent is not None


def make_agent(name: str, progress_delay_us: int) -> Any:
    """A UCX agent whose progress thread sleeps up to ``progress_delay_us`` between looks.

    The thread waits in ``poll()`` on UCX's event descriptors, so it wakes at once for work; the
    delay only bounds the wait. The Python wrapper hard-codes it to 0, which makes the thread
    spin, half a core per idle agent; its config takes no delay, so the binding's config class is
    swapped, for this one construction, for one that keeps ours.
    """
    bindings = _api.nixlBind

    class DelayedConfig(bindings.nixlAgentConfig):
        def __setattr__(self, field: str, value: Any) -> None:
            super().__setattr__(field, progress_delay_us if field == "pthrDelay" else value)

    with _config_swap:
        original, bindings.nixlAgentConfig = bindings.nixlAgentConfig, DelayedConfig
        try:
            return nixl_agent(name, nixl_agent_config(backends=["UCX"]))
        finally:
            bindings.nixlAgentConfig = original


def _meaning(error: Exception) -> str:
    """pdserve's one line on an exception a NIXL call raised: what it means, then NIXL's words."""
    kind = type(error).__name__
    return f"{MEANINGS.get(kind, 'NIXL failed')} ({kind}: {error})"


@contextlib.contextmanager
def explained(what: str) -> Iterator[None]:
    """Raises what a NIXL call in the block raises as a ``KVTransferError`` that says, after
    ``what``, what it means (NIXL's exception is named in the message, not chained)."""
    try:
        yield
    except KVTransferError:
        raise
    except Exception as error:  # the binding's own classes, all plain Exceptions
        raise KVTransferError(f"{what}: {_meaning(error)}") from None
