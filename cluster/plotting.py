"""matplotlib for the PNGs the tools write beside their JSON, where it is installed (a dev extra:
``pip install .`` alone serves without it)."""

from types import ModuleType


def pyplot() -> ModuleType | None:
    """``matplotlib.pyplot`` on the file-only Agg backend, or None where matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt
