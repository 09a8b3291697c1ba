"""The one place NIXL is imported: a plain ``nixl`` module where present, else the PyPI wheel.

On PyPI NIXL installs as ``nixl_cu12``; its agent and config live in ``nixl_cu12._api``. When
neither imports, ``nixl_agent`` is None and ``IMPORT_ERROR`` says why, for the fallback's log line.
This is also the one place that reaches NIXL's private binding (``_api.nixlBind``, in
``make_agent``); ``tests/unit/test_nixl_shim.py`` touches what it uses.
"""

import threading
from types import ModuleType
from typing import Any

__all__ = [
    "IMPORT_ERROR",
    "NIXL_VERSION",
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
