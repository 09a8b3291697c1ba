"""The prefix cache's event log: what a report holds, how long, and when it carries a snapshot."""

from pdserve.engine.block_pool import BlockPool
from pdserve.engine.kv_events import CLEARED, REMOVED, STORED, KVEventLog


def test_a_report_holds_the_events_of_the_last_window_reports() -> None:
    log = KVEventLog(window=2, snapshot_every=100)
    log.stored(b"a")
    first = log.report()
    assert (first.first_seq, first.events, first.next_seq) == (0, ((STORED, b"a"),), 1)
    assert first.snapshot == frozenset({b"a"})  # the first report has one
    log.stored(b"b")
    second = log.report()
    assert second.first_seq == 0 and second.next_seq == 2 and second.snapshot is None
    log.removed(b"a")
    third = log.report()  # the first report's event is out of the window now
    assert third.first_seq == 1 and third.events == ((STORED, b"b"), (REMOVED, b"a"))
    fourth = log.report()  # nothing new: the window is the third report's event
    assert fourth.first_seq == 2 and fourth.events == ((REMOVED, b"a"),)


def test_a_snapshot_every_few_reports_and_a_new_epoch_per_log() -> None:
    log = KVEventLog(window=1, snapshot_every=3)
    snapshots = []
    for i in range(7):
        log.stored(bytes([i]))
        snapshots.append(log.report().snapshot)
    assert [s is not None for s in snapshots] == [True, False, False, True, False, False, True]
    assert snapshots[3] == frozenset(bytes([i]) for i in range(4))
    log.cleared()
    report = log.report()
    assert report.events[-1] == (CLEARED, None)
    assert KVEventLog().epoch != log.epoch


def test_the_block_pool_logs_what_enters_and_leaves_its_cache() -> None:
    log = KVEventLog()
    pool = BlockPool(2, events=log)
    ids = pool.allocate(2)
    pool.cache(ids[0], b"x")
    pool.cache(ids[1], b"y")
    pool.cache(ids[1], b"y")  # already cached: no event
    pool.free(ids)
    pool.allocate(1)  # evicts the least recently freed: y (a request's tail goes first)
    assert log.report().events == ((STORED, b"x"), (STORED, b"y"), (REMOVED, b"y"))


def test_a_log_nobody_reads_keeps_only_its_newest_events() -> None:
    log = KVEventLog(window=2, snapshot_every=100, max_events=3)
    for i in range(5):
        log.stored(bytes([i]))
    report = log.report()
    assert report.first_seq == 2 and report.next_seq == 5
    assert report.events == tuple((STORED, bytes([i])) for i in (2, 3, 4))
    assert report.snapshot == frozenset(bytes([i]) for i in range(5))
