"""Generates the gRPC Python modules from ``pdserve.proto`` into ``router/api/_generated/``.

The output is a build product (gitignored), made on first import of ``grpc_service`` and again
whenever the .proto is newer, so the modules can never drift from it. protoc writes imports from
the path a .proto has under its include root, so the file is staged at
``pdserve/router/api/_generated/pdserve.proto``: the generated service module then imports its
messages as ``pdserve.router.api._generated.pdserve_pb2``, with no edits to generated code.
``python -m pdserve.router.api.grpc_codegen`` regenerates by hand. protoc runs in a child process:
its compiler library crashes a process that has loaded NIXL's own protobuf.
"""

import importlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

PROTO = Path(__file__).with_name("pdserve.proto")
OUTPUT_DIR = Path(__file__).with_name("_generated")
PACKAGE = "pdserve.router.api._generated"
MODULES = ("pdserve_pb2", "pdserve_pb2_grpc")
# Written last, so an older one than the .proto means the output is stale or incomplete.
STAMP = OUTPUT_DIR / f"{MODULES[-1]}.py"


def is_stale() -> bool:
    return not STAMP.is_file() or STAMP.stat().st_mtime < PROTO.stat().st_mtime


def generate() -> None:
    """Runs protoc; each file lands by an atomic rename, so concurrent imports see whole files."""
    OUTPUT_DIR.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=OUTPUT_DIR) as tmp:
        staged = Path(tmp, "in", *PACKAGE.split("."), PROTO.name)
        staged.parent.mkdir(parents=True)
        shutil.copyfile(PROTO, staged)
        out = Path(tmp, "out")
        out.mkdir()
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                f"-I{Path(tmp, 'in')}",
                f"--python_out={out}",
                f"--pyi_out={out}",
                f"--grpc_python_out={out}",
                str(staged),
            ],
            capture_output=True,
            text=True,
        )
        if run.returncode != 0:
            raise RuntimeError(f"protoc failed on {PROTO} ({run.returncode}): {run.stderr}")
        Path(out, *PACKAGE.split("."), "__init__.py").touch()
        produced = Path(out, *PACKAGE.split("."))
        for name in ("__init__.py", f"{MODULES[0]}.pyi", *(f"{m}.py" for m in MODULES)):
            os.replace(produced / name, OUTPUT_DIR / name)


def load() -> tuple[ModuleType, ModuleType]:
    """The generated (messages, service) modules, regenerated first if stale."""
    if is_stale():
        generate()
    messages, service = (importlib.import_module(f"{PACKAGE}.{module}") for module in MODULES)
    return messages, service


if __name__ == "__main__":
    generate()
    print(f"wrote {', '.join(MODULES)} to {OUTPUT_DIR}")
