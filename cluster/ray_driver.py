"""How a driver (the CLI, a benchmark, the tests) joins Ray without lending workers its folder.

Ray puts the driver's working directory first on every worker's ``sys.path`` (the job's
``py_driver_sys_path``), replicas included. Run from a checkout of pdserve, the checkout's
top-level folders (``kernels``, ``engine``, ``router``, ...) would then answer imports meant for
PyPI packages of the same names, Hugging Face's ``kernels`` among them. So the driver joins from
an empty folder of its own and goes back to where it was; a local cluster it starts keeps that
folder as its working directory, which is why the config hands workers absolute paths only.
"""

import os
import tempfile
from functools import cache
from typing import Any


@cache
def _empty_folder() -> str:
    return tempfile.mkdtemp(prefix="pdserve-driver-")


def init_ray(**init_args: Any) -> None:
    """``ray.init(**init_args)``, joined from an empty folder (see above)."""
    import ray

    here = os.getcwd()
    os.chdir(_empty_folder())
    try:
        ray.init(**init_args)
    finally:
        os.chdir(here)
