"""Where a request goes in a worker pool: the one place that scores a pool's replicas.

Each replica reports, through Serve's routing stats, its load and its prefix cache's changes as
numbered events (``engine/kv_events.py``). ``PoolPlacement`` keeps an index of each replica's
cached block hashes built from those events and scores a request's candidates once each:

    score = kv_overlap_weight * (cached prefix tokens - working-set tokens pushed out)
            - load_weight * load tokens

Load is what the prompt's first token waits for there, in tokens computed: the prompt tokens the
replica has queued, plus one for each sequence it runs (each adds a token to every step). A
replica's working set is the blocks of the requests this router sent there in the last ``HOT_S``
(or the blocks it holds, if more): what its next requests will ask for again. Whatever of it
the request's new blocks would push past the replica's KV capacity is prefilled again later, so
it counts against the cached tokens. That spreads new prefixes over the replicas' caches by room
instead of at random, where one replica's tenants would outgrow it and thrash (under LRU a
working set larger than the cache is evicted just before each reuse) while another's cache went
unused. ``HOT_S`` is short: a set of tenants that stopped coming must stop counting soon after.
Between reports, what this router sent a replica counts there: the prompt's uncached tokens as
load until the call ends or a report made after the send counts it, and its blocks as cached from
the send and again from the call's end until a trusted report made ``RECENT_S`` after the later
of the two speaks for them, ``FORGET_S`` at most (the prefix a burst shares is then as cheap there
as it will be once prefilled, and a prompt repeated after its call finds it however late the
reports come).
``RECENT_S`` covers the replica's work before it stores the blocks and the error in mapping a
report's stamp onto this router's clock (below).
Ties go to a random one of the best: in order, the first replica would take every new prefix and
thrash its cache while the others' went unused.

A replica that leaves the pool (Serve no longer routes to it: dead, or stopping) leaves its calls
in flight orphaned: ``orphaned`` says so of each until it ends, so that migration can give up on
a stream whose replica died silently (a host lost: no connection closes) instead of waiting for
the transport to notice.

A replica whose event log has a gap (it sent more reports than one holds while this router heard
none) has no index until its next snapshot (what this router sent it still counts); one from which
this router has heard no new report for ``STALE_S`` counts as caching nothing until it reports
again. A restarted replica starts a new log (its epoch), never extending its old index.

No instant crosses hosts, whose clocks may differ: a report's age is counted on this router's
clock from when it first heard that report (numbered by the replica, as Serve hands the same one
over and over). The replica's own stamp is read only against its other reports: the least gap
seen between its stamp and this router's hearing of it maps the replica's clock onto ours,
at most as late as the quickest delivery, whatever the offset between the two.

The ingress places a request in the decode pool (the cached prefix there decides between local
and remote prefill) and, when it goes remote, in the prefill pool, and writes both into the
request; the pools' request routers (``kv_routing.py``) send it there. A remote prefill's decode
call is sent only once its prompt is prefilled, so the ingress reserves the decode replica at
once: the load it will be there counts from the placement until the call is sent (or ends), or
a burst of long prompts would all see the same idle decode replicas and pile onto one at random.
Serve builds those routers itself, in the ingress's process, so they find the pool's placement
through ``register`` and ``placement_for``: this module's state, imported by reference (Serve
pickles a request router's own module by value, so state kept there would be a copy per router).
"""

import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from pdserve.engine.kv_events import CLEARED, REMOVED, STORED, KVEventReport
from pdserve.engine.prefix_hash import BlockHash
from pdserve.serving.messages import GenerateRequest

Role = Literal["prefill", "decode"]
RECENT_S = 5.0  # a report made this long after a block was sent (or its call ended) speaks for it
FORGET_S = 30.0  # how long blocks sent to a replica count as cached there without its word
LONGEST_CALL_S = 3600.0  # a call this old whose end was never heard of is forgotten
STALE_S = 10.0  # no new report from a replica this long: its index is not trusted
HOT_S = 10.0  # a block of a request sent this long ago is still in its replica's working set
RESERVED_S = 60.0  # a call placed this long ago and not sent yet no longer counts (never made)


class Placement(NamedTuple):
    replica: str  # Serve's replica id (unique_id)
    cached_tokens: int  # of the request's prompt, at that replica


@dataclass
class _Replica:
    epoch: str | None = None
    next_seq: int = 0  # the number of the next event to apply
    synced: bool = False  # whether ``cached`` is the replica's cache as of ``next_seq``
    cached: set[BlockHash] = field(default_factory=set)
    load_tokens: int = 0  # as of its last report
    held_blocks: int = 0  # as of its last report
    capacity_blocks: int | None = None  # its KV cache's size (None: not reported yet)
    report_seq: int | None = None  # that report's number
    heard_at: float = -math.inf  # when this router first heard it, on its own clock
    # The least (heard_at - the report's stamp) so far: the replica's clock onto this router's.
    clock_offset: float = math.inf
    made_at: float = -math.inf  # when its latest report was made, on this router's clock
    # Calls in flight there, by request id: (when sent, prompt tokens).
    sent: dict[str, tuple[float, int]] = field(default_factory=dict)
    # Calls placed there and not sent yet, by request id: (when placed, the load it will be).
    reserved: dict[str, tuple[float, int]] = field(default_factory=dict)
    # Each call in flight there, by request id: (when sent, its block hashes). The one record of
    # where a call went, so a replica that goes takes its calls along.
    calls: dict[str, tuple[float, tuple[BlockHash, ...]]] = field(default_factory=dict)
    recent: dict[BlockHash, float] = field(default_factory=dict)  # block -> when sent, or ended
    hot: dict[BlockHash, float] = field(default_factory=dict)  # block -> when last sent there

    def touch(self, block_hashes: tuple[BlockHash, ...], now: float) -> None:
        for block_hash in block_hashes:
            self.recent[block_hash] = now

    def apply(self, report: KVEventReport) -> None:
        if report.epoch != self.epoch:
            self.epoch, self.next_seq, self.cached = report.epoch, 0, set()
            self.synced = report.first_seq == 0  # a new log: its first report holds every event
        if self.synced and report.next_seq <= self.next_seq:
            return  # this report again (Serve repeats a replica's stats with other updates)
        if self.synced and report.first_seq <= self.next_seq <= report.next_seq:
            for kind, block_hash in report.events[self.next_seq - report.first_seq :]:
                if kind == STORED:
                    self.cached.add(block_hash)
                elif kind == REMOVED:
                    self.cached.discard(block_hash)
                elif kind == CLEARED:
                    self.cached.clear()
        elif report.snapshot is not None:
            self.cached, self.synced = set(report.snapshot), True
        else:
            self.synced = False  # a gap: wait for the next snapshot
        self.next_seq = report.next_seq


class PoolPlacement:
    def __init__(
        self,
        role: Role,
        block_size: int,
        kv_overlap_weight: float = 1.0,
        load_weight: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.role = role
        self._block_size = block_size
        self._kv_weight = kv_overlap_weight
        self._load_weight = load_weight
        self._now = clock
        self._replicas: dict[str, _Replica] = {}
        self._orphans: set[str] = set()  # requests in flight at a replica that left the pool
        # Serve's router thread updates the replicas while the ingress's places requests.
        self._lock = threading.RLock()

    @property
    def num_replicas(self) -> int:
        return len(self._replicas)

    def sync(self, reports: dict[str, dict | None]) -> None:
        """The pool's replicas now, each with its latest routing stats (None: none yet)."""
        with self._lock:
            for gone in self._replicas.keys() - reports.keys():
                self._orphans |= self._replicas.pop(gone).calls.keys()
            for replica_id, stats in reports.items():
                replica = self._replicas.setdefault(replica_id, _Replica())
                if stats:
                    self._observe(replica, stats)

    def place(self, request: GenerateRequest, candidates: list[str] | None = None) -> Placement:
        """The best of ``candidates`` (default: every replica) for ``request``, each scored once.
        A replica this placement has not heard of counts as empty and idle."""
        with self._lock:
            now = self._now()
            names = list(self._replicas) if candidates is None else candidates
            if not names:
                raise LookupError(f"no {self.role} replica to place {request.request_id} on")
            scored = []
            for name in names:
                replica = self._replicas.get(name) or _Replica()
                cached = self._overlap(replica, request, now) * self._block_size
                kept = cached - self._evicted(replica, request) * self._block_size
                score = self._kv_weight * kept - self._load_weight * self._load(replica)
                scored.append((score, cached, name))
            best = max(score for score, _, _ in scored)
            _, cached, name = random.choice([s for s in scored if s[0] == best])
            return Placement(name, cached)

    def reserve(self, replica_id: str, request: GenerateRequest, load_tokens: int) -> None:
        """``request`` will be sent to the replica (placed there, its call not made yet): it counts
        there as ``load_tokens`` of load, whatever the reports say, until it is sent or ends."""
        with self._lock:
            replica = self._replicas.setdefault(replica_id, _Replica())
            replica.reserved[request.request_id] = (self._now(), load_tokens)

    def sent(self, replica_id: str, request: GenerateRequest) -> None:
        """``request`` went to the replica: its prompt's uncached part is load there until its
        call ends or a later report counts it, its blocks cached there until a report speaks for
        them, and in its working set for ``HOT_S``."""
        with self._lock:
            self._end(request.request_id, stored=False)  # sent again, e.g. after a rejection
            replica = self._replicas.setdefault(replica_id, _Replica())
            now = self._now()
            uncached = len(request.prompt_token_ids) - (
                self._overlap(replica, request, now) * self._block_size
            )
            replica.sent[request.request_id] = (now, uncached)
            replica.calls[request.request_id] = (now, request.block_hashes)
            replica.touch(request.block_hashes, now)
            for block_hash in request.block_hashes:
                replica.hot[block_hash] = now

    def ended(self, request_id: str) -> None:
        """The call for ``request_id`` has ended (returned, failed or was cancelled). The caller
        says so: Serve's own completion callback does not fire for unary calls over its gRPC
        transport (Ray 2.60), and a report can come a second after a short call ended."""
        with self._lock:
            self._end(request_id, stored=True)

    def orphaned(self, request_id: str) -> bool:
        """Whether ``request_id``'s call is in flight at a replica that has left the pool."""
        with self._lock:
            return request_id in self._orphans

    def _end(self, request_id: str, stored: bool) -> None:
        """``stored``: the call ran there, so its blocks are there now; else it went elsewhere."""
        self._orphans.discard(request_id)
        for placed in self._replicas.values():
            placed.reserved.pop(request_id, None)
        replica = next((r for r in self._replicas.values() if request_id in r.calls), None)
        if replica is None:  # never sent, or its replica is gone
            return
        replica.sent.pop(request_id, None)
        _, block_hashes = replica.calls.pop(request_id, (0.0, ()))
        if stored:
            replica.touch(block_hashes, self._now())
        else:  # (another call there with the same blocks loses them too, until a report)
            for block_hash in block_hashes:
                replica.recent.pop(block_hash, None)
                replica.hot.pop(block_hash, None)

    def view(self) -> dict[str, dict]:
        """Each replica as this placement sees it now (for operators and tests)."""
        with self._lock:
            now = self._now()
            return {
                name: {
                    # the age of the replica's latest report, on this router's clock
                    "report_age_s": now - replica.made_at,
                    "load_tokens": self._load(replica),
                    "reported_load_tokens": replica.load_tokens,
                    "cached_blocks": len(replica.cached) if replica.synced else None,
                    "calls_in_flight": len(replica.sent),
                    "calls_reserved": len(replica.reserved),
                    "working_set_blocks": len(replica.hot),
                }
                for name, replica in self._replicas.items()
            }

    def saturated(self, max_load_tokens: int) -> bool:
        """Whether every replica has at least ``max_load_tokens`` tokens of load."""
        with self._lock:
            replicas = list(self._replicas.values())
            return bool(replicas) and all(self._load(r) >= max_load_tokens for r in replicas)

    def _observe(self, replica: _Replica, stats: dict) -> None:
        if stats["report_seq"] == replica.report_seq:
            return  # this report again (Serve repeats a replica's stats with other updates)
        now = self._now()
        replica.report_seq, replica.heard_at = stats["report_seq"], now
        replica.clock_offset = min(replica.clock_offset, now - stats["made_at"])
        report: KVEventReport | None = stats.get("kv_events")
        if report is not None:
            replica.apply(report)
        else:  # a replica that logs no events (routed by Serve's default router once)
            replica.synced = False
        replica.load_tokens = stats["num_queued_prefill_tokens"] + stats["num_running"]
        replica.held_blocks = stats["num_blocks"] - stats["num_free_blocks"]
        replica.capacity_blocks = stats["num_blocks"]
        replica.hot = {h: t for h, t in replica.hot.items() if now - t <= HOT_S}
        # Calls sent before the report was made (on this router's clock) are in its load, or over.
        replica.made_at = stats["made_at"] + replica.clock_offset
        for request_id, (sent_at, _) in list(replica.sent.items()):
            if sent_at <= replica.made_at:
                del replica.sent[request_id]
        # Blocks sent (or whose call ended) RECENT_S before a trusted report: the report's word.
        spoken_for = replica.made_at - RECENT_S if replica.synced else -math.inf
        replica.recent = {
            h: t for h, t in replica.recent.items() if t > spoken_for and now - t <= FORGET_S
        }
        replica.calls = {
            r: call for r, call in replica.calls.items() if now - call[0] <= LONGEST_CALL_S
        }
        replica.reserved = {
            r: call for r, call in replica.reserved.items() if now - call[0] <= RESERVED_S
        }

    def _overlap(self, replica: _Replica, request: GenerateRequest, now: float) -> int:
        """The prompt's leading blocks cached at the replica, or sent there by this router and
        not yet spoken for by its reports."""
        if now - replica.heard_at >= STALE_S:
            return 0  # silent: perhaps hung, its calls' blocks no draw
        cached = replica.cached if replica.synced else set()
        overlap = 0
        for block_hash in request.block_hashes:
            touched = replica.recent.get(block_hash)
            if block_hash not in cached and (touched is None or now - touched > FORGET_S):
                break
            overlap += 1
        return overlap

    def _evicted(self, replica: _Replica, request: GenerateRequest) -> int:
        """The blocks by which the replica's working set, with ``request``'s new blocks, would
        outgrow its cache."""
        if replica.capacity_blocks is None:
            return 0
        new = sum(block_hash not in replica.hot for block_hash in request.block_hashes)
        working_set = max(len(replica.hot), replica.held_blocks)
        return max(0, working_set + new - replica.capacity_blocks)

    def _load(self, replica: _Replica) -> int:
        sent = sum(tokens for _, tokens in replica.sent.values())
        return replica.load_tokens + sent + sum(tokens for _, tokens in replica.reserved.values())


_placements: dict[tuple[str, Role], PoolPlacement] = {}


def register(model: str, role: Role, placement: PoolPlacement) -> PoolPlacement:
    _placements[model, role] = placement
    return placement


def placement_for(model: str, role: Role) -> PoolPlacement | None:
    """The placement of a pool this process calls; None before its request router exists, or
    when the pool is routed by Serve's default router."""
    return _placements.get((model, role))
