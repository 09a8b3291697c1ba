"""The package's layers (docs/architecture.md): imports flow one way, light processes stay light.

benchmarks → cluster → router, prefill_worker, decode_worker → serving → kvtransfer → engine →
kernels. A folder may import itself and the folders its entry lists, nothing else: the router
and the workers never import each other, and nothing imports the layers above it. Imports inside
functions and ``TYPE_CHECKING`` blocks count too. ``cluster/cli.py`` reaches ``benchmarks/`` by
module name only, at run time. Inside ``router/``, the client-facing API (``api/``) and the
dispatch to the pools (``dispatch/``) never import each other: they meet in ``ingress.py``.
"""

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_BASE = {"kernels"}
_ENGINE = _BASE | {"engine"}
_TRANSFER = _ENGINE | {"kvtransfer"}
_SERVING = _TRANSFER | {"serving"}
_ROLES = _SERVING | {"router", "prefill_worker", "decode_worker"}
# folder -> the folders of pdserve it may import (beside itself)
ALLOWED: dict[str, set[str]] = {
    "kernels": set(),
    "engine": _BASE,
    "kvtransfer": _ENGINE,
    "serving": _TRANSFER,
    "router": _SERVING,
    "prefill_worker": _SERVING,
    "decode_worker": _SERVING,
    "cluster": _ROLES,
    "benchmarks": _ROLES | {"cluster"},
    "": {"engine"},  # the package's __init__: the offline API, lazily
}


ROUTER_ROOMS = {"api", "dispatch"}


def _imported_modules(tree: ast.AST) -> set[str]:
    """The dotted names of the modules of pdserve that ``tree`` imports, less ``pdserve.``."""
    modules = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
            if node.module == "pdserve":  # from pdserve import engine
                names = [f"pdserve.{alias.name}" for alias in node.names]
        for name in names:
            if name.startswith("pdserve."):
                modules.add(name.removeprefix("pdserve."))
    return modules


def _imported_folders(tree: ast.AST) -> set[str]:
    return {module.split(".")[0] for module in _imported_modules(tree)}


def layer_violations(root: Path) -> list[str]:
    """``path: imports folder`` for each import against the layers, over the package's code."""
    violations = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        folder = relative.parts[0] if len(relative.parts) > 1 else ""
        if folder not in ALLOWED:  # tests, the venv, models: not the package's layers
            continue
        allowed = ALLOWED[folder] | {folder}
        for imported in sorted(_imported_folders(ast.parse(path.read_text())) - allowed):
            violations.append(f"{relative}: imports pdserve.{imported}")
    return violations


def room_violations(root: Path) -> list[str]:
    """``path: imports room`` for each import of one of ``router/``'s rooms from the other, or
    from a module of ``router/`` other than the ingress."""
    violations = []
    for path in sorted((root / "router").rglob("*.py")):
        relative = path.relative_to(root / "router")
        if relative == Path("ingress.py"):
            continue
        own = relative.parts[0] if len(relative.parts) > 1 else None
        modules = _imported_modules(ast.parse(path.read_text()))
        rooms = {m.split(".")[1] for m in modules if m.startswith("router.")}
        for room in sorted(rooms & ROUTER_ROOMS - {own}):
            violations.append(f"router/{relative}: imports pdserve.router.{room}")
    return violations


def test_the_package_imports_one_way() -> None:
    assert layer_violations(ROOT) == []


def test_the_router_rooms_meet_only_in_the_ingress() -> None:
    assert room_violations(ROOT) == []


def test_every_top_level_folder_with_code_has_a_layer() -> None:
    folders = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests"}
    assert folders <= set(ALLOWED), folders - set(ALLOWED)


@pytest.mark.parametrize(
    ("folder", "source"),
    [
        ("serving", "from pdserve.router.api.errors import model_not_found\n"),
        ("engine", "def f():\n    import pdserve.kvtransfer.leases\n"),
        ("router", "from pdserve import prefill_worker\n"),
        (
            "kernels",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pdserve.engine\n",
        ),
    ],
)
def test_an_upward_import_is_caught(tmp_path: Path, folder: str, source: str) -> None:
    (tmp_path / folder).mkdir()
    (tmp_path / folder / "bad.py").write_text(source)
    assert len(layer_violations(tmp_path)) == 1


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("api/bad.py", "from pdserve.router.dispatch.placement import placement_for\n"),
        ("dispatch/bad.py", "def f():\n    from pdserve.router.api import errors\n"),
        ("metrics.py", "import pdserve.router.api.errors\n"),
    ],
)
def test_an_import_across_the_rooms_is_caught(tmp_path: Path, module: str, source: str) -> None:
    path = tmp_path / "router" / module
    path.parent.mkdir(parents=True)
    path.write_text(source)
    assert len(room_violations(tmp_path)) == 1


def _run(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


@pytest.mark.slow  # a fresh interpreter: seconds of imports
def test_the_router_imports_no_torch() -> None:
    result = _run(
        """
        import sys
        import pdserve.router.ingress, pdserve.router.dispatch.kv_routing, pdserve.serving.messages
        print(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# Installs a finder that refuses the packages only the dev extra brings, then runs the CLI.
_WITHOUT_DEV = """
import importlib.abc, sys
DEV = {"openai", "transformers", "pytest", "ruff", "matplotlib"}
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in DEV:
            raise ImportError(f"{name} is a dev-only package")
sys.meta_path.insert(0, Refuse())
from pdserve.cluster.cli import main
raise SystemExit(main(sys.argv[1:]))
"""


def _cli_without_dev(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _WITHOUT_DEV, *argv],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )


def test_serve_help_needs_no_dev_package() -> None:
    result = _cli_without_dev("serve", "--help")
    assert result.returncode == 0, result.stderr
    assert "--prefill-replicas" in result.stdout


@pytest.mark.slow  # a fresh interpreter: seconds of imports
def test_generate_needs_no_dev_package(tiny_model_dir: Path) -> None:
    result = _cli_without_dev(
        "generate", "--model", str(tiny_model_dir), "--prompt", "The cache holds",
        "--max-tokens", "4",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()


def test_help_imports_no_subcommand() -> None:
    result = _run(
        """
        import contextlib, io, sys
        from pdserve.cluster.cli import main
        with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
            main(["--help"])
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "ray")))
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
