"""llama.cpp's server, the CPU peer: built from the sources that the llama-cpp-python sdist on
PyPI vendors, for this CPU (``GGML_NATIVE``), into a cache folder, once per CPU.

The sdist is downloaded from PyPI's simple index (its SHA-256 checked against the one pinned here)
unless ``--llama-cpp-sdist`` names one; the build needs cmake and a C++ compiler (4.3 minutes on
2 cores of an AMD EPYC).
"""

import hashlib
import json
import logging
import os
import subprocess
import tarfile
import urllib.request
from pathlib import Path

from pdserve.kernels.native import cpu_name

logger = logging.getLogger(__name__)

DISTRIBUTION, VERSION = "llama-cpp-python", "0.3.36"
SDIST = f"llama_cpp_python-{VERSION}.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SIMPLE_INDEX = f"https://pypi.org/simple/{DISTRIBUTION}/"
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"  # PEP 691
VENDORED = Path("vendor") / "llama.cpp"  # in the sdist's folder
SERVER = "llama-server"
CMAKE_OPTIONS = {
    "CMAKE_BUILD_TYPE": "Release",
    "GGML_NATIVE": "ON",  # -march=native: every instruction this CPU has
    "LLAMA_CURL": "OFF",  # a server that loads only local files
    "LLAMA_OPENSSL": "OFF",
    "LLAMA_BUILD_TESTS": "OFF",
    "LLAMA_BUILD_EXAMPLES": "OFF",
    "LLAMA_BUILD_SERVER": "ON",
}
# On a CPU with AMX, GGML_NATIVE builds ggml's AMX kernels, which die of SIGILL at their first
# tile instruction (Q8_0 and Q4 weights; llama.cpp asks the kernel for AMX state on its main
# thread only: ggml-org/llama.cpp pull request 26954). Built without them, the AVX-512 (VNNI)
# kernels serve those types. GCC keeps an explicit -mno-* over what -march=native implies.
NO_AMX_FLAGS = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


def default_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "pdserve" / "llama.cpp"


def cpu_flags() -> list[str]:
    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.exists() else []
    line = next((line for line in lines if line.startswith("flags")), "flags:")
    return line.split(":", 1)[1].split()


def cmake_options() -> dict[str, str]:
    """The build's options for this CPU: ``CMAKE_OPTIONS``, without AMX where the CPU has it."""
    if "amx_tile" not in cpu_flags():
        return CMAKE_OPTIONS
    return CMAKE_OPTIONS | {"CMAKE_C_FLAGS": NO_AMX_FLAGS, "CMAKE_CXX_FLAGS": NO_AMX_FLAGS}


def cpu_key() -> str:
    """Names this CPU's build: its model name and a digest of its feature flags and the build's
    options, since a native build may not run on a CPU with fewer."""
    options = [f"{key}={value}" for key, value in sorted(cmake_options().items())]
    digest = hashlib.sha256(" ".join(cpu_flags() + options).encode())
    return "-".join(cpu_name().split()) + "-" + digest.hexdigest()[:8]


def download_sdist(cache: Path) -> Path:
    """The sdist in ``cache``, downloaded from PyPI if it is not there yet."""
    path = cache / SDIST
    if path.is_file() and _sha256(path) == SDIST_SHA256:
        return path
    index = urllib.request.Request(SIMPLE_INDEX, headers={"Accept": SIMPLE_JSON})
    with urllib.request.urlopen(index, timeout=60) as answer:
        (url,) = [f["url"] for f in json.load(answer)["files"] if f["filename"] == SDIST]
    cache.mkdir(parents=True, exist_ok=True)
    logger.info("downloading %s", url)
    partial = path.with_suffix(".part")
    urllib.request.urlretrieve(url, partial)
    if _sha256(partial) != SDIST_SHA256:
        partial.unlink()
        raise RuntimeError(f"{url}: its SHA-256 is not the one pinned in {__name__}")
    partial.rename(path)
    return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while block := file.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def build_server(cache: Path, sdist: Path | None = None) -> Path:
    """``llama-server`` built for this CPU in ``cache`` (reused when built already)."""
    build = cache / f"build-{VERSION}-{cpu_key()}"
    binary = build / "bin" / SERVER
    if binary.is_file():
        return binary
    sources = cache / f"src-{VERSION}"
    if not (sources / VENDORED / "CMakeLists.txt").is_file():
        archive = sdist or download_sdist(cache)
        with tarfile.open(archive) as tar:
            (top,) = {Path(name).parts[0] for name in tar.getnames()}
            tar.extractall(cache / "extract", filter="data")
        (cache / "extract" / top).rename(sources)
    options = [f"-D{key}={value}" for key, value in cmake_options().items()]
    logger.info("building %s %s for %s into %s (minutes)", SERVER, VERSION, cpu_key(), build)
    subprocess.run(["cmake", "-S", sources / VENDORED, "-B", build, *options], check=True)
    jobs = str(os.cpu_count() or 1)
    subprocess.run(["cmake", "--build", build, "--target", SERVER, "-j", jobs], check=True)
    return binary


def server_argv(
    binary: Path, gguf: Path, port: int, threads: int, slots: int, context: int
) -> list[str]:
    """``llama-server`` on ``gguf`` at 127.0.0.1:``port``: ``threads`` threads for decode and
    prefill, ``slots`` sequences batched at once (continuous batching), ``context`` tokens of KV
    shared among them."""
    return [
        str(binary),
        *("--model", str(gguf), "--host", "127.0.0.1", "--port", str(port)),
        *("--threads", str(threads), "--threads-batch", str(threads)),
        *("--parallel", str(slots), "--ctx-size", str(context), "--cont-batching"),
        "--no-webui",
    ]
