"""The pool of KV blocks: reference counts, the LRU free queue and the prefix cache.

A block whose reference count drops to zero goes to the back of the free queue but keeps its hash,
so a later request with the same prefix can take it back (a cache hit) until the block is handed out
again, which evicts its hash. Allocation takes from the front: least recently freed first.
"""

from collections import OrderedDict
from dataclasses import dataclass

from pdserve.engine.kv_events import KVEventLog
from pdserve.engine.prefix_hash import BlockHash


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: BlockHash | None = None  # set once the block is full and registered in the cache


class BlockPool:
    def __init__(
        self, num_blocks: int, enable_caching: bool = True, events: KVEventLog | None = None
    ) -> None:
        """``events``: where the prefix cache's changes are logged (for KV-aware routing)."""
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.events = events
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Insertion-ordered map used as an O(1) LRU queue: popitem(last=False) takes the oldest, and
        # a cache hit removes a block from the middle in O(1).
        self._free: OrderedDict[int, Block] = OrderedDict((b.block_id, b) for b in self.blocks)
        self._cached: dict[BlockHash, Block] = {}
        self.prefix_cache_queries = 0  # prompt tokens looked up
        self.prefix_cache_hits = 0  # of which found cached

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def can_allocate(self, n: int) -> bool:
        return n <= len(self._free)

    def allocate(self, n: int) -> list[int]:
        if not self.can_allocate(n):
            raise RuntimeError(f"asked for {n} KV blocks, {len(self._free)} free")
        ids = []
        for _ in range(n):
            _, block = self._free.popitem(last=False)
            self._evict(block)
            block.ref_count = 1
            ids.append(block.block_id)
        return ids

    def free(self, block_ids: list[int]) -> None:
        """Drops a reference from each block; unreferenced ones become free, keeping their hash."""
        # Reversed: a request's tail blocks are the least likely to be shared; evict them first.
        for block_id in reversed(block_ids):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count < 0:
                raise RuntimeError(f"KV block {block_id} freed more often than allocated")
            if block.ref_count == 0:
                self._free[block_id] = block

    def lookup(self, hashes: list[BlockHash], max_blocks: int) -> list[int]:
        """The longest run of cached blocks matching ``hashes`` (``max_blocks`` at most)."""
        if not self.enable_caching:
            return []
        found = []
        for h in hashes[:max_blocks]:
            block = self._cached.get(h)
            if block is None:
                break
            found.append(block.block_id)
        return found

    def num_free_among(self, block_ids: list[int]) -> int:
        """How many of these cached blocks are free (taking them uses free capacity)."""
        return sum(1 for i in block_ids if self.blocks[i].ref_count == 0)

    def take(self, block_ids: list[int]) -> None:
        """Adds a reference to cached blocks from ``lookup``, pulling free ones off the queue."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self._free[block_id]
            block.ref_count += 1

    def cache(self, block_id: int, block_hash: BlockHash) -> None:
        """Registers a full block under its hash (the first block with a given hash keeps it)."""
        if not self.enable_caching or block_hash in self._cached:
            return
        block = self.blocks[block_id]
        block.hash = block_hash
        self._cached[block_hash] = block
        if self.events is not None:
            self.events.stored(block_hash)

    def reset_prefix_cache(self) -> bool:
        """Forgets every cached hash, so later prompts compute from scratch (a benchmark's cold
        start). Refused, returning False, while any block is in use, as vLLM's is: a running
        request's blocks stay registered."""
        if len(self._free) != self.num_blocks:
            return False
        for block in self._cached.values():
            block.hash = None
        self._cached.clear()
        if self.events is not None:
            self.events.cleared()
        return True

    def record_lookup(self, num_tokens: int, num_hit_tokens: int) -> None:
        self.prefix_cache_queries += num_tokens
        self.prefix_cache_hits += num_hit_tokens

    def _evict(self, block: Block) -> None:
        if block.hash is not None:
            del self._cached[block.hash]
            if self.events is not None:
                self.events.removed(block.hash)
            block.hash = None
