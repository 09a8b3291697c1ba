"""``pdserve bench NAME [options]``: each benchmark prints a baseline from the same run.

A table only: ``cluster/cli.py`` imports the named benchmark's module when it runs.
"""

# benchmark -> (module exposing ``add_arguments(parser)`` and ``run(args) -> int``, one-line help)
SUBCOMMANDS = {
    "decode-step": (
        "pdserve.benchmarks.decode_step",
        "decode step time of our engine vs transformers, beside the memory-bandwidth bound",
    ),
    "engine": (
        "pdserve.benchmarks.engine_throughput",
        "offline throughput on a heterogeneous workload: our engine vs transformers",
    ),
    "kv-transfer": (
        "pdserve.benchmarks.kv_transfer",
        "KV transfer between two Ray actors: NIXL pull, the object store, a copy",
    ),
    "ramp": (
        "pdserve.benchmarks.ramp",
        "a stepped request rate against a server with its planner on: replicas and latency",
    ),
    "quantization": (
        "pdserve.benchmarks.quantization",
        "greedy agreement of int8 weights with the fp32 ones on held-out text",
    ),
    "peers": (
        "pdserve.benchmarks.peers.cli",
        "pdserve against llama.cpp's server on the same weights, cores and load",
    ),
    "serve": (
        "pdserve.benchmarks.serve_bench.cli",
        "online serving load as vllm bench serve: TTFT, TPOT, ITL, throughput, goodput",
    ),
    "cluster-latency": (
        "pdserve.benchmarks.cluster_latency",
        "TTFT and ITL through the cluster (aggregated, disaggregated) vs offline",
    ),
    "chaos": (
        "pdserve.benchmarks.chaos",
        "streams while replicas are killed and clients disconnect: endings, leaks, memory",
    ),
}
