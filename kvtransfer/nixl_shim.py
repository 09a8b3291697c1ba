"""The one place NIXL is imported: a plain ``nixl`` module where present, else the PyPI wheel.

On PyPI NIXL installs as ``nixl_cu12``; its agent and config live in ``nixl_cu12._api``. When
neither imports, ``nixl_agent`` is None and ``IMPORT_ERROR`` says why, for the fallback's log line.
"""

from typing import Any

__all__ = ["IMPORT_ERROR", "nixl_agent", "nixl_agent_config", "nixl_available"]

nixl_agent: Any = None
nixl_agent_config: Any = None
IMPORT_ERROR: str | None = None

try:
    from nixl._api import nixl_agent, nixl_agent_config
except ImportError:
    try:
        from nixl_cu12._api import nixl_agent, nixl_agent_config
    except ImportError as error:  # the wheel is missing, or its native libraries failed to load
        IMPORT_ERROR = f"{type(error).__name__}: {error}"


def nixl_available() -> bool:
    return nixl_agent is not None
