"""KV transfer between two Ray actors: NIXL pull, the object store, an in-process copy.

The owner's cache holds a prompt's blocks at ids 0..n-1; the reader takes them into n ids drawn
at random (seeded) from a cache twice that size, as a busy decode pool would hand them out. Each
mode is warmed up (the first NIXL transfer sets up UCX's connection) and checked once for
bit-identical blocks; then the modes are timed in turn, so a busy neighbour slows all of them
alike. "Transfer" is the time in the connector calls, measured inside the actors (export + pull);
"end to end" adds Ray's calls between them, measured from the driver. Each backend runs with its
integrity checks (checksums at export, checked where the blocks land) and without, in the same
rounds, so the checks' cost is measured against a baseline of the same run.
The baseline copies the same blocks between two caches in this process, one ``copy_`` per block.
"""

import argparse
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch

from pdserve.cluster.ray_driver import init_ray
from pdserve.engine.config import EngineConfig, ModelConfig
from pdserve.engine.kv_cache import allocate_kv_cache, kv_block_bytes

BLOCK_SIZE = 16
TOKENS = [256, 2048, 16384]  # a short prompt, issue 4's 2,048 tokens, and a long one
REPEATS = 10
WARMUP = 2
SEED = 0
TIMEOUT_SECONDS = 60.0  # per transfer: the object store moving hundreds of MB on a busy machine
COPY = "copy, per block"
INDEXED_COPY = "copy, dst[ids] = src[ids]"
FALLBACK = "object store pull"


class TransferKind(NamedTuple):
    backend: str
    verify: bool  # the connectors' integrity checks (kvtransfer/integrity.py)


TRANSFERS = {
    "NIXL pull": TransferKind("nixl", True),
    "NIXL pull, unchecked": TransferKind("nixl", False),
    FALLBACK: TransferKind("object_store", True),
    "object store pull, unchecked": TransferKind("object_store", False),
}
AIM_OF_COPY = 0.5  # issue 4: NIXL at >= 50% of the copy's bandwidth ...
AIM_OVER_FALLBACK = 5.0  # ... and >= 5x the fallback's

IDLE_SECONDS = 2.0  # how long each actor's idle CPU time is measured


class Timed(NamedTuple):
    """One repetition."""

    seconds: float  # in the connector calls (a copy: the copy itself)
    longest_call: float  # the longest any one call held its caller (a copy: the copy itself)
    end_to_end: float  # with Ray's calls between the connectors, from the driver


class Mode(NamedTuple):
    name: str
    one: Callable[[], Timed]  # moves the blocks once
    clear: Callable[[], None]  # zeroes the destination blocks
    landed: Callable[[], bool]  # the destination blocks equal the source's, bit for bit


class ModeResult(NamedTuple):
    mode: str
    nbytes: int
    timed: list[Timed]  # per timed repetition
    identical: bool

    @property
    def seconds(self) -> list[float]:
        return [t.seconds for t in self.timed]

    @property
    def bandwidth(self) -> float:
        """Payload bytes per second, one way, at the median transfer time."""
        return self.nbytes / statistics.median(self.seconds)


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def reader_block_ids(num_blocks: int, seed: int) -> list[int]:
    """``num_blocks`` distinct ids, shuffled, out of a cache of twice as many."""
    perm = torch.randperm(2 * num_blocks, generator=torch.Generator().manual_seed(seed))
    return perm[:num_blocks].tolist()


def time_modes(modes: list[Mode], nbytes: int, warmup: int, repeats: int) -> list[ModeResult]:
    """Checks each mode's first (warm-up) transfer, then times ``repeats`` rounds of all modes."""
    identical = []
    for mode in modes:
        mode.clear()
        mode.one()
        identical.append(mode.landed())
        for _ in range(warmup - 1):
            mode.one()
    timed: list[list[Timed]] = [[] for _ in modes]
    for _ in range(repeats):
        for mode, times in zip(modes, timed, strict=True):
            times.append(mode.one())
    return [
        ModeResult(mode.name, nbytes, times, ok)
        for mode, times, ok in zip(modes, timed, identical, strict=True)
    ]


def copy_modes(
    src: torch.Tensor, dst: torch.Tensor, src_ids: list[int], dst_ids: list[int]
) -> list[Mode]:
    """The baselines, between two caches in this process: one ``copy_`` per block, as UCX makes
    one operation per descriptor; and the indexed copy, whose gather fills a fresh temporary."""
    src_index, dst_index = torch.tensor(src_ids), torch.tensor(dst_ids)

    def timed(copy: Callable[[], None]) -> Callable[[], Timed]:
        def one() -> Timed:
            start = time.perf_counter()
            copy()
            seconds = time.perf_counter() - start
            return Timed(seconds, seconds, seconds)

        return one

    def per_block() -> None:
        for s, d in zip(src_ids, dst_ids, strict=True):
            dst[d].copy_(src[s])

    def indexed() -> None:
        dst[dst_index] = src[src_index]

    def clear() -> None:
        dst[dst_index] = 0

    def landed() -> bool:
        return torch.equal(dst[dst_index], src[src_index])

    return [
        Mode(COPY, timed(per_block), clear, landed),
        Mode(INDEXED_COPY, timed(indexed), clear, landed),
    ]


def print_table(sizes: dict[int, list[ModeResult]], block_size: int) -> None:
    print(
        "| tokens | blocks | MB | mode | transfer ms, median (min-max) | GB/s | of copy "
        "| x fallback | longest call ms | end to end ms | identical |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    aims = []
    for tokens, results in sizes.items():
        by_mode = {r.mode: r for r in results}
        copy, fallback = by_mode[COPY].bandwidth, by_mode[FALLBACK].bandwidth
        for r in results:
            ms = [s * 1e3 for s in r.seconds]
            print(
                f"| {tokens} | {blocks_for(tokens, block_size)} | {r.nbytes / 1e6:.1f} | {r.mode} "
                f"| {statistics.median(ms):.1f} ({min(ms):.1f}-{max(ms):.1f}) "
                f"| {r.bandwidth / 1e9:.2f} | {r.bandwidth / copy:.0%} "
                f"| {r.bandwidth / fallback:.1f}x "
                f"| {statistics.median(t.longest_call for t in r.timed) * 1e3:.1f} "
                f"| {statistics.median(t.end_to_end for t in r.timed) * 1e3:.1f} "
                f"| {'yes' if r.identical else 'NO'} |"
            )
        for checked, unchecked in _check_pairs():
            cost = statistics.median(by_mode[checked].seconds) / statistics.median(
                by_mode[unchecked].seconds
            )
            aims.append(f"{checked}, {tokens} tokens: checked in {cost:.0%} of the unchecked time")
        for mode in (name for name, kind in TRANSFERS.items() if kind == ("nixl", True)):
            of_copy, over = by_mode[mode].bandwidth / copy, by_mode[mode].bandwidth / fallback
            aims.append(
                f"{mode}, {tokens} tokens: {of_copy:.0%} of the copy (aim >= {AIM_OF_COPY:.0%}: "
                f"{'met' if of_copy >= AIM_OF_COPY else 'missed'}), {over:.1f}x the fallback "
                f"(aim >= {AIM_OVER_FALLBACK:.0f}x: "
                f"{'met' if over >= AIM_OVER_FALLBACK else 'missed'})"
            )
    print("\n" + "\n".join(aims))


def _check_pairs() -> list[tuple[str, str]]:
    """(checked mode, the same backend's unchecked mode) for each backend."""
    unchecked = {kind.backend: name for name, kind in TRANSFERS.items() if not kind.verify}
    return [(name, unchecked[kind.backend]) for name, kind in TRANSFERS.items() if kind.verify]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, default=Path("models/small"))
    parser.add_argument("--preset", default="small", help="made into --model when it is missing")
    parser.add_argument("--tokens", type=int, nargs="+", default=TOKENS, help="prompt lengths")
    parser.add_argument("--block-size", type=int, default=BLOCK_SIZE)
    parser.add_argument("--repeats", type=int, default=REPEATS, help="timed rounds of all modes")
    parser.add_argument("--warmup", type=int, default=WARMUP, help="untimed first transfers, >= 1")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the copies")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--timeout", type=float, default=TIMEOUT_SECONDS, help="per transfer, s")
    parser.add_argument("--address", help="run the two actors on this running Ray cluster")


def run(args: argparse.Namespace) -> int:
    import ray

    from pdserve.benchmarks import kv_transfer_peer as peers

    if args.warmup < 1:
        raise ValueError(f"--warmup must be >= 1 (the checked transfer), got {args.warmup}")
    torch.set_num_threads(args.threads)
    if not (args.model / "config.json").exists():
        from pdserve.cluster.make_model import make_model

        make_model(args.preset, args.model)
    model = ModelConfig.from_pretrained(args.model)
    engine = EngineConfig(model=str(args.model), block_size=args.block_size)
    max_blocks = max(blocks_for(tokens, args.block_size) for tokens in args.tokens)
    reader_ids = reader_block_ids(max_blocks, args.seed)
    src = allocate_kv_cache(model, engine, max_blocks)
    src.normal_(generator=torch.Generator().manual_seed(args.seed))
    dst = allocate_kv_cache(model, engine, 2 * max_blocks)
    block_bytes = kv_block_bytes(model, args.block_size, engine.torch_dtype)
    load_before = os.getloadavg()[0]
    # "local": a Ray of our own, never one that `ray start` left running on this machine.
    own = {} if args.address else {"num_cpus": 2, "include_dashboard": False}
    init_ray(address=args.address or "local", log_to_driver=False, **own)
    try:
        owner, reader = peers.start_peers(str(args.model), max_blocks, args)
        actor_threads = ray.get(owner.num_threads.remote())
        idle_before = peers.idle_cpu(owner, reader, IDLE_SECONDS)
        sizes = {}
        for tokens in args.tokens:
            num_blocks = blocks_for(tokens, args.block_size)
            src_ids, dst_ids = list(range(num_blocks)), reader_ids[:num_blocks]
            modes = copy_modes(src, dst, src_ids, dst_ids)
            modes += peers.transfer_modes(owner, reader, src_ids, dst_ids)
            sizes[tokens] = time_modes(modes, num_blocks * block_bytes, args.warmup, args.repeats)
        idle_after = peers.idle_cpu(owner, reader, IDLE_SECONDS)
    finally:
        ray.shutdown()
    print(
        f"model {args.model}: {model.num_hidden_layers} layers, {model.num_key_value_heads} KV "
        f"heads x {model.head_dim} dims, {args.block_size}-token blocks, {engine.dtype}: "
        f"{block_bytes / 1024:.0f} KiB per block"
    )
    print(
        f"owner blocks 0..n-1; reader blocks n distinct ids shuffled out of {2 * max_blocks} "
        f"(seed {args.seed}); median of {args.repeats} rounds after {args.warmup} warm-up(s)"
    )
    print(
        f"copies on {args.threads} torch thread(s), actors on {actor_threads}; load average "
        f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after; transfer = connector calls "
        "timed in the actors, end to end = with Ray's calls, from the driver"
    )
    print(
        "idle actors' CPU (owner, reader; each holds two NIXL and two object-store connectors, "
        "checked and unchecked), share "
        f"of a core over {IDLE_SECONDS:.0f} s: {idle_before[0]:.1%}, {idle_before[1]:.1%} before "
        f"the first transfer; {idle_after[0]:.1%}, {idle_after[1]:.1%} after the last\n"
    )
    print_table(sizes, args.block_size)
    tokens = " ".join(map(str, args.tokens))
    print(
        f"\ncommand: pdserve bench kv-transfer --model {args.model} --tokens {tokens} "
        f"--block-size {args.block_size} --repeats {args.repeats} --warmup {args.warmup} "
        f"--threads {args.threads} --seed {args.seed}"
    )
    return 0 if all(r.identical for results in sizes.values() for r in results) else 1
