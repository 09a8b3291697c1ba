"""The hash chain over full KV blocks that names cached prefixes.

``hash(parent, tokens, extra_keys)``: a block's hash covers its tokens and, through the parent,
every token before it, so equal hashes mean equal prefixes. Stable across processes (blake2b, not
Python's salted ``hash``), so the router can compute the chain the engines compute.
"""

import hashlib
from array import array
from collections.abc import Sequence

BlockHash = bytes
HASH_BYTES = 16  # 128 bits: collisions are negligible at any realistic cache size


def hash_block(
    parent: BlockHash | None, token_ids: Sequence[int], extra_keys: str = ""
) -> BlockHash:
    """``extra_keys`` keep apart blocks of equal tokens but different meaning (a cache salt)."""
    h = hashlib.blake2b(digest_size=HASH_BYTES)
    h.update(parent or b"")
    h.update(array("q", token_ids).tobytes())
    h.update(extra_keys.encode())
    return h.digest()


def extend_block_hashes(
    hashes: list[BlockHash], token_ids: Sequence[int], block_size: int, extra_keys: str = ""
) -> None:
    """Appends the hashes of the full blocks of ``token_ids`` that ``hashes`` does not cover yet."""
    for i in range(len(hashes), len(token_ids) // block_size):
        parent = hashes[-1] if hashes else None
        block = token_ids[i * block_size : (i + 1) * block_size]
        hashes.append(hash_block(parent, block, extra_keys))
