"""Run a benchmark: ``pdserve bench NAME [options]``; each prints a baseline from the same run."""

import argparse
import importlib

BENCHMARKS = {
    "decode-step": "pdserve.benchmarks.decode_step",
    "engine": "pdserve.benchmarks.engine_throughput",
    "kv-transfer": "pdserve.benchmarks.kv_transfer",
    "cluster-latency": "pdserve.benchmarks.cluster_latency",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="benchmark", required=True)
    for name, module_name in BENCHMARKS.items():
        module = importlib.import_module(module_name)
        module.add_arguments(sub.add_parser(name, help=module.__doc__.splitlines()[0]))


def run(args: argparse.Namespace) -> int:
    return importlib.import_module(BENCHMARKS[args.benchmark]).run(args)
