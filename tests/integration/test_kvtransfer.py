"""KV blocks moved between two Ray actors, each holding a tiny-preset engine and its cache.

The prefill actor runs a real 300-token prefill and holds the blocks; the decode actor pulls them
into different block ids (over NIXL or the object-store fallback), and its decode must give
exactly the greedy tokens of the single-process engine.
"""

import time

import pytest
import ray
import torch

from pdserve.engine.sampling_params import SamplingParams
from pdserve.kvtransfer.connector import LEASE_MARGIN_SECONDS
from pdserve.kvtransfer.handles import IncompatiblePeerError, KVTransferError
from pdserve.kvtransfer.nixl_shim import nixl_available
from pdserve.tests.integration.kv_peer import KVPeer

pytestmark = pytest.mark.slow

NUM_BLOCKS = 64
MAX_TOKENS = 24
TIMEOUT = 3.0  # the readers' transfer timeout
VOCAB_SIZE = 4096  # the tiny preset's
PARAMS = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=2)
BACKENDS = [
    pytest.param(
        "nixl", marks=pytest.mark.skipif(not nixl_available(), reason="NIXL not importable")
    ),
    "object_store",
]


@pytest.fixture(scope="module", autouse=True)
def _on_ray(ray_cluster) -> None:
    """The peers are actors on the session's cluster."""


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    generator = torch.Generator().manual_seed(0)
    return torch.randint(0, VOCAB_SIZE, (300,), generator=generator).tolist()


@pytest.fixture(scope="module")
def readers(tiny_model_dir):
    """One decode-side actor per backend, shared by the module. Its pool starts elsewhere, so its
    block ids differ from an owner's, and it caches no prefix, so every test's prompt is pulled."""
    actors = {}
    for backend in ("nixl", "object_store"):
        actors[backend] = KVPeer.remote(
            str(tiny_model_dir),
            NUM_BLOCKS,
            backend,
            timeout=TIMEOUT,
            enable_prefix_caching=False,
        )
        actors[backend].occupy.remote(7)
    yield actors
    _kill_all(actors)


@pytest.fixture(scope="module")
def owners(tiny_model_dir, readers):
    actors = {backend: owner_for(tiny_model_dir, readers, backend) for backend in readers}
    yield actors
    _kill_all(actors)


def _kill_all(actors: dict) -> None:
    """The session's cluster outlives the module: its actors must not."""
    for actor in actors.values():
        ray.kill(actor)


def owner_for(model_dir, readers, backend, **args):
    owner = KVPeer.remote(str(model_dir), NUM_BLOCKS, backend, **args)
    ray.get(readers[backend].add_peer.remote(ray.get(owner.info.remote())))
    return owner


@pytest.fixture(scope="module")
def expected(owners, prompt):
    """The single-process engine's output, in an actor like the others (same thread settings,
    so the logprobs must match to the bit: this random model's greedy tokens alone barely
    depend on the KV, its logprobs do)."""
    tokens, logprobs = ray.get(owners["object_store"].generate.remote(prompt, PARAMS))
    assert len(tokens) == MAX_TOKENS and len(logprobs) == MAX_TOKENS
    return tokens, logprobs


def decoded_as_expected(got, expected) -> bool:
    """A remote-prefilled decode: same tokens, same logprobs after the prefill's first token."""
    return got[0] == expected[0] and got[1] == expected[1][1:]


def wait_all_free(owner, timeout: float = 10.0) -> int:
    total = ray.get(owner.num_blocks.remote())
    deadline = time.monotonic() + timeout
    while (free := ray.get(owner.poll.remote())) != total and time.monotonic() < deadline:
        time.sleep(0.01)
    return free


def kill(actor, export) -> None:
    """Kills an owner and waits until its process is gone (so is its memory, which a NIXL read
    could otherwise still reach) and, with the object store, until Ray has noticed."""
    pid = ray.get(actor.pid.remote())
    ray.kill(actor)
    deadline = time.monotonic() + 10.0
    while _process_alive(pid):
        assert time.monotonic() < deadline, f"owner process {pid} still alive after 10 s"
        time.sleep(0.01)
    if export.payload is None:
        return
    # Ray learns of an owner's death asynchronously; until then its objects can still be read.
    while time.monotonic() < deadline:
        try:
            ray.get(export.payload, timeout=1.0)
        except ray.exceptions.OwnerDiedError:
            return
        except ray.exceptions.GetTimeoutError:
            pass  # still asking the owner
        time.sleep(0.05)
    raise AssertionError("the dead owner's object is still readable after 10 s")


def _process_alive(pid: int) -> bool:
    """Whether the process exists and is not a zombie (whose memory is already gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("backend", BACKENDS)
def test_pull_gives_identical_blocks_and_tokens(owners, readers, prompt, expected, backend):
    owner, reader = owners[backend], readers[backend]
    first, owner_blocks = ray.get(owner.prefill.remote(prompt))
    export = ray.get(owner.export.remote(owner_blocks))
    reader_blocks = ray.get(reader.reserve.remote("pull", prompt, PARAMS))
    assert reader_blocks != owner_blocks
    ray.get(reader.pull.remote(export, reader_blocks))

    assert torch.equal(
        ray.get(reader.blocks.remote(reader_blocks)), ray.get(owner.blocks.remote(owner_blocks))
    )
    assert decoded_as_expected(ray.get(reader.decode.remote("pull", first)), expected)
    assert wait_all_free(owner) == NUM_BLOCKS  # the reader's notice ended the lease
    stats = ray.get(reader.stats.remote())
    assert stats["num_transfers"] >= 1 and stats["num_descriptors"] >= len(owner_blocks)


@pytest.mark.parametrize("backend", BACKENDS)
def test_dead_owner_fails_the_reader_within_the_timeout(
    tiny_model_dir, readers, prompt, expected, backend
):
    owner, reader = owner_for(tiny_model_dir, readers, backend), readers[backend]
    _, owner_blocks = ray.get(owner.prefill.remote(prompt))
    export = ray.get(owner.export.remote(owner_blocks))
    reader_blocks = ray.get(reader.reserve.remote("dead-owner", prompt, PARAMS))
    kill(owner, export)
    error, seconds = ray.get(reader.timed_pull.remote(export, reader_blocks))
    assert error is not None and seconds < TIMEOUT + 0.5, (error, seconds)
    # The caller falls back to recomputing the prompt here.
    assert ray.get(reader.recompute.remote("dead-owner")) == expected


def test_expired_lease_frees_owner_blocks_and_refuses_the_pull(
    tiny_model_dir, readers, prompt, expected
):
    owner = owner_for(tiny_model_dir, readers, "nixl", lease_seconds=LEASE_MARGIN_SECONDS + 0.5)
    reader = readers["nixl"]
    _, owner_blocks = ray.get(owner.prefill.remote(prompt))
    export = ray.get(owner.export.remote(owner_blocks))
    assert ray.get(owner.poll.remote()) == NUM_BLOCKS - len(owner_blocks)  # pinned, unread
    assert wait_all_free(owner) == NUM_BLOCKS
    assert ray.get(owner.stats.remote())["num_leases_expired"] == 1
    reader_blocks = ray.get(reader.reserve.remote("expired", prompt, PARAMS))
    with pytest.raises(KVTransferError, match="lease"):
        ray.get(reader.pull.remote(export, reader_blocks))
    assert ray.get(reader.recompute.remote("expired")) == expected


def test_a_dropped_lease_frees_owner_blocks_at_the_next_poll(tiny_model_dir, readers, prompt):
    # What the router does when its request ends before a decode replica takes the KV. NIXL's
    # owner holds blocks under a lease (the object store's frees them at export); a fresh owner,
    # as the shared ones have the prompt cached, and cached blocks count as free.
    owner = owner_for(tiny_model_dir, readers, "nixl")
    _, owner_blocks = ray.get(owner.prefill.remote(prompt))
    export = ray.get(owner.export.remote(owner_blocks))
    assert ray.get(owner.poll.remote()) == NUM_BLOCKS - len(owner_blocks)  # pinned, unread
    expired = ray.get(owner.stats.remote())["num_leases_expired"]
    ray.get(owner.drop_lease.remote(export.lease_id))
    assert ray.get(owner.poll.remote()) == NUM_BLOCKS  # at once, not at the expiry
    assert ray.get(owner.stats.remote())["num_leases_expired"] == expired
    ray.kill(owner)


@pytest.mark.parametrize(
    "difference, named",
    [({"block_size": 32}, "block_size: 16 != 32"), ({"dtype": "bfloat16"}, "dtype: 'float32'")],
)
def test_incompatible_peer_is_refused(tiny_model_dir, readers, difference, named):
    theirs = KVPeer.remote(str(tiny_model_dir), NUM_BLOCKS, "nixl", **difference)
    with pytest.raises(IncompatiblePeerError, match=named):
        ray.get(readers["nixl"].add_peer.remote(ray.get(theirs.info.remote())))


def test_readers_end_with_every_block_free(readers):
    for reader in readers.values():
        ray.get(reader.vacate.remote())
        assert ray.get(reader.poll.remote()) == NUM_BLOCKS
