"""Whether a process could import the checkout's folders as top-level modules.

The import package ``pdserve`` is the checkout's root, so its folders (``kernels``, ``engine``,
``router``, ...) import as top-level modules from any ``sys.path`` entry that is the root, where
they shadow PyPI packages of the same names: Hugging Face's ``kernels``, which transformers
imports, among them. Python puts the working directory there for ``python -m`` and ``python -c``
unless ``PYTHONSAFEPATH`` is set (the Makefile and tests/conftest.py set it), and Ray puts the
driver's on every worker's path (cluster/ray_driver.py joins from an empty folder).
"""

import importlib.util
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = tuple(sorted(p.parent.name for p in ROOT.glob("*/__init__.py")))


def shadowing(path: list[str] | None = None) -> list[str]:
    """What in this process (or in ``path``, a ``sys.path``) could import a folder of the checkout
    as a top-level module: the entries that are the root ('' is the working directory), and the
    folders whose top-level import resolves inside the checkout."""
    entries = sys.path if path is None else path
    found = [repr(e) for e in entries if Path(e or os.getcwd()).resolve() == ROOT]
    if path is None:
        for folder in FOLDERS:
            spec = importlib.util.find_spec(folder)
            if spec and spec.origin and Path(spec.origin).resolve().parent == ROOT / folder:
                found.append(f"import {folder}: {spec.origin}")
    return found
