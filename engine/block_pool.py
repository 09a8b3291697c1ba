"""The pool of KV blocks: which are free, which a request holds."""

from collections import deque


class BlockPool:
    """Hands out block ids; every block allocated must come back through ``free``."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def can_allocate(self, n: int) -> bool:
        return n <= len(self._free)

    def allocate(self, n: int) -> list[int]:
        if not self.can_allocate(n):
            raise RuntimeError(f"asked for {n} KV blocks, {len(self._free)} free")
        return [self._free.popleft() for _ in range(n)]

    def free(self, block_ids: list[int]) -> None:
        # Reversed: a request's tail blocks are the least likely to be shared; reuse them first.
        self._free.extend(reversed(block_ids))
