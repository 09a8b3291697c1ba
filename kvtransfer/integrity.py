"""Checked KV: each exported block's checksum, taken where the prefill wrote it, is checked where
the block landed, so a decode replica never decodes from KV other than the owner exported.

A block can land wrong three ways: corrupted on the way, overwritten under the read (a torn read,
or the owner handed it to another request), or freed by its owner before the read was done. The
checksum catches the first two; the block's generation (NIXL, which reads the owner's live
memory) catches the third, even while the bytes are still intact. Either is a
``KVIntegrityError``, which the engine answers as any failed transfer: it recomputes the prompt.
The checksum is XXH3's 64-bit hash (the ``xxhash`` package): ~6x zlib's CRC-32 on this project's
CPUs, cheap enough to stay on by default (docs/benchmarks.md, "KV transfer between two workers").
"""

from collections.abc import Sequence

import torch
import xxhash

from pdserve.kvtransfer.handles import KVIntegrityError


def block_checksums(kv_cache: torch.Tensor, block_ids: Sequence[int]) -> tuple[int, ...]:
    """The XXH3-64 hash of each block's bytes, in the order given."""
    on_host = kv_cache.device.type == "cpu"
    # A host cache is read in place (a block is contiguous: the cache is block-major); a GPU
    # cache's blocks come to the host in one gathered copy.
    blocks = kv_cache if on_host else kv_cache[list(block_ids)].cpu()
    rows = block_ids if on_host else range(len(block_ids))
    # As bytes: numpy has no bfloat16.
    return tuple(xxhash.xxh3_64_intdigest(blocks[row].view(torch.uint8).numpy()) for row in rows)


def check_checksums(
    what: str, kv_cache: torch.Tensor, block_ids: Sequence[int], expected: Sequence[int]
) -> None:
    """Raises ``KVIntegrityError`` unless each block's bytes still have the checksum exported."""
    _check(
        what, "differs from its checksum at export", block_checksums(kv_cache, block_ids), expected
    )


def check_generations(what: str, read: Sequence[int], expected: Sequence[int]) -> None:
    """Raises ``KVIntegrityError`` unless each block's generation, read back after its bytes, is
    the one exported: else its owner freed it (and may have reused it) before the read ended."""
    _check(what, "was freed by its owner during the read", read, expected)


def _check(what: str, fault: str, got: Sequence[int], expected: Sequence[int]) -> None:
    bad = [i for i, (g, e) in enumerate(zip(got, expected, strict=True)) if g != e]
    if bad:
        raise KVIntegrityError(
            f"{what}: {len(bad)} of {len(expected)} blocks landed wrong; block {bad[0]} of the "
            f"pull {fault}"
        )
