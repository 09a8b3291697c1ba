"""``pdserve build-kernels``: compiles the native CPU kernels for this CPU (``kernels/native.py``).

Without a C++ compiler it says so and exits 0: the PyTorch kernels serve in their place.
"""

import argparse

from pdserve.kernels import native


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    try:
        path = native.build()
    except RuntimeError as error:
        print(f"not built: {error}")
        return 0
    print(f"built the native CPU kernels for {native.cpu_capability()}: {path}")
    return 0
