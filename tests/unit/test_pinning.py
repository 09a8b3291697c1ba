"""A replica pinned to a core: every thread it runs, and every one it starts later, stays there."""

import contextlib
import os
import threading

import pytest

from pdserve.serving.replica import pin_process

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity"), reason="thread affinity is Linux's"
)


def _live_threads() -> list[int]:
    return [int(t) for t in os.listdir("/proc/self/task")]


def _affinity_of_every_thread() -> set[frozenset[int]]:
    affinities = set()
    for thread_id in _live_threads():
        with contextlib.suppress(ProcessLookupError):  # ended since the listing
            affinities.add(frozenset(os.sched_getaffinity(thread_id)))
    return affinities


def test_every_thread_now_and_later_runs_on_the_core() -> None:
    before = os.sched_getaffinity(0)
    core = max(before)
    stop = threading.Event()
    running = threading.Thread(target=stop.wait)
    running.start()
    try:
        pin_process(core)
        later = {}
        started = threading.Thread(target=lambda: later.update(cores=os.sched_getaffinity(0)))
        started.start()
        started.join()
        assert os.sched_getaffinity(running.native_id) == {core}
        assert later["cores"] == {core}
        assert _affinity_of_every_thread() == {frozenset({core})}
    finally:
        stop.set()
        running.join()
        for thread_id in _live_threads():
            with contextlib.suppress(ProcessLookupError):  # ended since the listing
                os.sched_setaffinity(thread_id, before)
