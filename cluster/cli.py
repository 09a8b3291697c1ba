"""The ``pdserve`` command line: one subcommand per verb, each in its own module."""

import argparse
import importlib

from pdserve.cluster.serve_env import apply_serve_env

# subcommand -> module exposing ``add_arguments(parser)`` and ``run(args) -> int``
SUBCOMMANDS = {
    "make-model": "pdserve.cluster.make_model",
    "generate": "pdserve.cluster.generate",
    "bench": "pdserve.cluster.bench",
    "serve": "pdserve.cluster.serve",
}


def main(argv: list[str] | None = None) -> int:
    apply_serve_env()  # before any subcommand imports ray.serve
    parser = argparse.ArgumentParser(prog="pdserve")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, module_name in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        module.add_arguments(sub.add_parser(name, help=module.__doc__.splitlines()[0]))
    args = parser.parse_args(argv)
    return importlib.import_module(SUBCOMMANDS[args.command]).run(args)


if __name__ == "__main__":
    raise SystemExit(main())
