"""A chunked NIXL transfer against a fake agent: no NIXL, no second process."""

import pytest

from pdserve.kvtransfer.handles import KVTransferError
from pdserve.kvtransfer.nixl_xfer import ChunkedXfer

NOTIFICATION = b"release:lease-0"


class FakeHandle:
    def __init__(self, local_ids: list[int], notification: bytes) -> None:
        self.local_ids = local_ids
        self.notification = notification
        self.state = "PROC"
        self.released = False

    def release(self) -> None:
        self.released = True


class FakeAgent:
    """Posts complete at once (like cma) when ``synchronous``, else when the test says so."""

    def __init__(self, synchronous: bool) -> None:
        self.synchronous = synchronous
        self.posted: list[FakeHandle] = []

    def make_prepped_xfer(self, op, local, local_ids, remote, remote_ids, notification):
        assert local_ids == remote_ids  # the tests pass the same ids on both sides
        return FakeHandle(local_ids, notification)

    def transfer(self, handle: FakeHandle) -> str:
        self.posted.append(handle)
        if self.synchronous:
            handle.state = "DONE"
        return handle.state

    def check_xfer_state(self, handle: FakeHandle) -> str:
        return handle.state


def chunked(agent: FakeAgent, num_blocks: int, chunk_blocks: int, budget: float) -> ChunkedXfer:
    ids = list(range(num_blocks))
    return ChunkedXfer("test", agent, None, ids, None, ids, NOTIFICATION, chunk_blocks, budget)


def test_synchronous_posts_go_one_chunk_per_poll_and_only_the_last_notifies() -> None:
    agent = FakeAgent(synchronous=True)
    xfer = chunked(agent, num_blocks=10, chunk_blocks=4, budget=0.0)
    assert [xfer.poll() for _ in range(3)] == [False, False, True]
    assert [h.local_ids for h in agent.posted] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert [h.notification for h in agent.posted] == [b"", b"", NOTIFICATION]
    assert all(h.released for h in agent.posted)


def test_the_notifying_chunk_waits_until_the_others_have_landed() -> None:
    agent = FakeAgent(synchronous=False)
    xfer = chunked(agent, num_blocks=10, chunk_blocks=4, budget=60.0)
    assert not xfer.poll()  # posts at once go out in one poll, all but the last
    assert len(agent.posted) == 2
    agent.posted[0].state = "DONE"
    assert not xfer.poll() and len(agent.posted) == 2
    agent.posted[1].state = "DONE"
    assert not xfer.poll() and agent.posted[-1].notification == NOTIFICATION
    agent.posted[-1].state = "DONE"
    assert xfer.poll()


def test_an_error_raises_and_release_cancels_what_is_in_flight() -> None:
    agent = FakeAgent(synchronous=False)
    xfer = chunked(agent, num_blocks=10, chunk_blocks=4, budget=60.0)
    xfer.poll()
    agent.posted[0].state = "ERR"
    with pytest.raises(KVTransferError, match="test: UCX failed the transfer"):
        xfer.poll()
    xfer.release()
    assert all(h.released for h in agent.posted)


def test_a_last_chunk_goes_after_every_block_has_landed_and_notifies() -> None:
    # A checked pull's generation counters: read only once the blocks are in.
    agent = FakeAgent(synchronous=False)
    ids = list(range(6))
    last = ([100, 101], [100, 101])
    xfer = ChunkedXfer("test", agent, None, ids, None, ids, NOTIFICATION, 4, 60.0, last=last)
    assert not xfer.poll() and [h.local_ids for h in agent.posted] == [[0, 1, 2, 3], [4, 5]]
    for handle in agent.posted:
        handle.state = "DONE"
    assert not xfer.poll() and agent.posted[-1].local_ids == [100, 101]
    assert [h.notification for h in agent.posted] == [b"", b"", NOTIFICATION]
    agent.posted[-1].state = "DONE"
    assert xfer.poll()
