"""The ``pdserve`` command line: one subcommand per verb, each in its own module.

A subcommand's module (and with it torch, Ray or a benchmark's packages) is imported only when
that subcommand runs, so ``pdserve --help`` answers at once and ``pdserve serve`` needs none of
the packages another verb uses.
"""

import argparse
import importlib
import importlib.metadata
import sys
from types import ModuleType

from pdserve.cluster.ports import PortInUseError
from pdserve.cluster.serve_env import apply_serve_env
from pdserve.engine.errors import CheckpointError

DISTRIBUTION = "pdserve"
# What the user must fix, not pdserve's bug: its one line, not a traceback.
USER_ERRORS = (CheckpointError, PortInUseError)
# subcommand -> (module exposing ``add_arguments(parser)`` and ``run(args) -> int``, one-line help)
SUBCOMMANDS = {
    "make-model": ("pdserve.cluster.make_model", "write a built-in model in Hugging Face format"),
    "generate": ("pdserve.cluster.generate", "generate offline with the engine (no cluster)"),
    "bench": ("pdserve.benchmarks.cli", "run a benchmark against a baseline from the same run"),
    "serve": ("pdserve.cluster.serve", "serve models on Ray until Ctrl-C"),
    "gateway": (
        "pdserve.cluster.gateway_cli",
        "HAProxy in front of a running cluster's router replicas, until Ctrl-C",
    ),
    "prometheus": (
        "pdserve.cluster.prometheus_cli",
        "the Prometheus the planner reads, on a running cluster's head, until Ctrl-C",
    ),
    "build-kernels": (
        "pdserve.cluster.build_kernels",
        "compile the native CPU kernels for this CPU",
    ),
    "profile": (
        "pdserve.cluster.planner.profiler",
        "measure a replica's prefill and decode times for the planner",
    ),
}


def dispatch(
    prog: str, commands: dict[str, tuple[str, str]], argv: list[str], version: str | None = None
) -> tuple[ModuleType, argparse.Namespace]:
    """Parses ``argv`` as ``prog COMMAND ...``, importing only COMMAND's module; returns it with
    the parsed arguments. A module with a ``SUBCOMMANDS`` table of its own is a group (``pdserve
    bench NAME``). Without a known command, prints the usage (exits 0 on --help or --version,
    when ``version`` is given, else 2)."""
    if not argv or argv[0] not in commands:
        parser = argparse.ArgumentParser(prog=prog)
        if version is not None:
            parser.add_argument("--version", action="version", version=f"{prog} {version}")
        sub = parser.add_subparsers(dest="command", required=True)
        for name, (_, help_line) in commands.items():
            sub.add_parser(name, help=help_line)
        parser.parse_args(argv)  # exits with the usage or the error
        raise SystemExit(2)
    name, *rest = argv
    module_name, help_line = commands[name]
    module = importlib.import_module(module_name)
    if hasattr(module, "SUBCOMMANDS"):
        return dispatch(f"{prog} {name}", module.SUBCOMMANDS, rest)
    parser = argparse.ArgumentParser(prog=f"{prog} {name}", description=help_line)
    module.add_arguments(parser)
    return module, parser.parse_args(rest)


def main(argv: list[str] | None = None) -> int:
    apply_serve_env()  # before any subcommand imports ray.serve
    version = importlib.metadata.version(DISTRIBUTION)
    argv = sys.argv[1:] if argv is None else argv
    module, args = dispatch("pdserve", SUBCOMMANDS, argv, version)
    try:
        return module.run(args)
    except USER_ERRORS as error:
        print(f"pdserve: error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
