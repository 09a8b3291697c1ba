"""The checkout's folders never import as top-level modules (tests/shadowing.py): not in the
tests' process, nor in the interpreters they start; the Ray workers' side is
tests/integration/test_no_shadowing_on_ray.py."""

import os
import subprocess
import sys

from pdserve.tests.shadowing import FOLDERS, ROOT, shadowing

_REPORT = "from pdserve.tests.shadowing import shadowing; print(shadowing())"


def test_the_checkout_has_folders_that_could_shadow() -> None:
    assert {"kernels", "engine", "router", "cluster"} <= set(FOLDERS)


def test_nothing_in_this_process_imports_from_the_checkout() -> None:
    assert shadowing() == []


def test_kernels_is_hugging_faces_package() -> None:
    import kernels  # transformers' dependency: the name the checkout's kernels/ once answered

    assert "site-packages" in kernels.__file__, kernels.__file__


def test_an_interpreter_started_in_the_checkout_imports_nothing_from_it() -> None:
    run = subprocess.run(
        [sys.executable, "-c", _REPORT], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert run.stdout.strip() == "[]", run.stdout


def test_the_check_sees_the_checkout_on_the_path() -> None:
    assert shadowing([str(ROOT), *sys.path]) == [repr(str(ROOT))]
    safe = {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}
    run = subprocess.run(
        [sys.executable, "-c", _REPORT], cwd=ROOT, env=safe, capture_output=True, text=True
    )
    assert "import kernels" in run.stdout and "''" in run.stdout, run.stdout
