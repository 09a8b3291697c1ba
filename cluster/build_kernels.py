"""``pdserve build-kernels``: compiles the native CPU kernels for this CPU (``kernels/native.py``).

Without a C++ compiler it says so and exits 0: the PyTorch kernels serve in their place. With
one, sources that do not compile are an error (exit 1), so that ``make setup`` and CI stop there
instead of testing the PyTorch kernels in the native ones' place.
"""

import argparse

from pdserve.kernels import native


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    try:
        path = native.build()
    except native.NoCompiler as error:
        print(f"not built: {error}")
        return 0
    except RuntimeError as error:
        print(f"the native CPU kernels did not compile: {error}")
        return 1
    print(f"built the native CPU kernels for {native.cpu_capability()}: {path}")
    return 0
