"""The prefix cache's changes as a numbered log: a block's hash stored, a hash removed, or the whole
cache cleared (vLLM's KV events, which Dynamo's router indexes).

The engine thread appends as its block pool changes; the replica reads ``report()`` from its own
thread for the router (``router/dispatch/placement.py``). A report holds the events of the last
``window`` reports, so a router that missed a few (Serve hands routers only each replica's latest
report) still applies every event in order, and, every ``snapshot_every`` reports, the whole set
of cached hashes, from which a router that missed more starts again. ``epoch`` is new with every
log: a restarted replica's events never extend an old view of it.
"""

import threading
import uuid
from collections import deque
from dataclasses import dataclass

from pdserve.engine.prefix_hash import BlockHash

STORED, REMOVED, CLEARED = "+", "-", "0"
Event = tuple[str, BlockHash | None]


@dataclass(frozen=True)
class KVEventReport:
    epoch: str
    first_seq: int  # the number of ``events[0]``
    events: tuple[Event, ...]
    snapshot: frozenset[BlockHash] | None  # every cached hash after the last event, or None

    @property
    def next_seq(self) -> int:
        return self.first_seq + len(self.events)


class KVEventLog:
    def __init__(
        self, window: int = 8, snapshot_every: int = 40, max_events: int = 1 << 20
    ) -> None:
        """``max_events`` bounds the log if reports stop: the oldest go, and a router that needed
        them waits for a snapshot."""
        self.epoch = uuid.uuid4().hex
        self._window = window
        self._snapshot_every = snapshot_every
        self._events: deque[Event] = deque(maxlen=max_events)
        self._next_seq = 0  # the number of the next event logged
        # Where each of the last reports ended, the oldest being where the window begins.
        self._report_ends: deque[int] = deque(maxlen=window + 1)
        self._num_reports = 0
        self._cached: set[BlockHash] = set()
        self._lock = threading.Lock()

    def stored(self, block_hash: BlockHash) -> None:
        with self._lock:
            self._log((STORED, block_hash))
            self._cached.add(block_hash)

    def removed(self, block_hash: BlockHash) -> None:
        with self._lock:
            self._log((REMOVED, block_hash))
            self._cached.discard(block_hash)

    def cleared(self) -> None:
        with self._lock:
            self._log((CLEARED, None))
            self._cached.clear()

    def report(self) -> KVEventReport:
        """The events of the last ``window`` reports (this one included), the oldest dropped."""
        with self._lock:
            self._report_ends.append(self._next_seq)
            oldest = self._report_ends[0] if len(self._report_ends) > self._window else 0
            for _ in range(oldest - (self._next_seq - len(self._events))):
                self._events.popleft()
            snapshot = None
            if self._num_reports % self._snapshot_every == 0:
                snapshot = frozenset(self._cached)
            self._num_reports += 1
            first_seq = self._next_seq - len(self._events)
            return KVEventReport(self.epoch, first_seq, tuple(self._events), snapshot)

    def _log(self, event: Event) -> None:
        self._events.append(event)  # past max_events, the oldest goes
        self._next_seq += 1
