"""Checked KV between two Ray actors (tiny-preset engines, as in test_kvtransfer.py): a block
corrupted on the way, freed early or reused under the read is caught where it lands, counted
under reason "checksum", and the prompt recomputed to exactly the fault-free output."""

import pytest
import ray
import torch

from pdserve.engine.sampling_params import SamplingParams
from pdserve.kvtransfer.handles import KVIntegrityError
from pdserve.kvtransfer.nixl_shim import nixl_available
from pdserve.tests.integration.kv_peer import KVPeer

pytestmark = pytest.mark.slow

NUM_BLOCKS = 64
OCCUPIED = 7  # the reader's blocks taken first, so its block ids differ from the owner's
TIMEOUT = 3.0
VOCAB_SIZE = 4096  # the tiny preset's
PARAMS = SamplingParams(temperature=0.0, max_tokens=16, logprobs=2)
needs_nixl = pytest.mark.skipif(not nixl_available(), reason="NIXL not importable")
# free_early is NIXL's alone: the object store copies the blocks at export (kvtransfer/faults.py).
CASES = [
    *(("nixl", fault) for fault in ("corrupt", "free_early", "reuse")),
    *(("object_store", fault) for fault in ("corrupt", "reuse")),
]
FAULTS = [
    pytest.param(case, marks=needs_nixl if case[0] == "nixl" else (), id="-".join(case))
    for case in CASES
]


@pytest.fixture(scope="module", autouse=True)
def _on_ray(ray_cluster) -> None:
    """The peers are actors on the session's cluster."""


def _prompt(seed: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB_SIZE, (300,), generator=generator).tolist()


@pytest.fixture(scope="module")
def pairs(tiny_model_dir):
    """An owner and a reader per backend, made at first use and shared by the module's tests (each
    actor's start is seconds on two cores); ``pairs(backend, fault)`` sets the fault both apply,
    each in its role. Every test takes blocks out of the reader's pool first, so that its block
    ids differ from the owner's, and leaves both pools whole."""
    made = {}

    def pair(backend: str, fault: str):
        if backend not in made:
            owner = KVPeer.remote(str(tiny_model_dir), NUM_BLOCKS, backend)
            reader = KVPeer.remote(
                str(tiny_model_dir),
                NUM_BLOCKS,
                backend,
                timeout=TIMEOUT,
                enable_prefix_caching=False,
            )
            ray.get(reader.add_peer.remote(ray.get(owner.info.remote())))
            made[backend] = owner, reader
        owner, reader = made[backend]
        ray.get([owner.inject.remote(fault), reader.inject.remote(fault)])
        ray.get(reader.occupy.remote(OCCUPIED))
        return owner, reader

    yield pair
    for actor in (actor for both in made.values() for actor in both):
        ray.kill(actor)


def _both_pools_whole(owner, reader, export) -> None:
    ray.get(reader.vacate.remote())
    assert ray.get(reader.poll.remote()) == NUM_BLOCKS
    ray.get(owner.drop_lease.remote(export.lease_id))
    assert ray.get(owner.poll.remote()) == NUM_BLOCKS


@pytest.mark.parametrize("backend_fault", FAULTS)
def test_integrity_a_block_that_landed_wrong_is_caught_counted_and_recomputed(pairs, backend_fault):
    owner, reader = pairs(*backend_fault)
    prompt = _prompt(CASES.index(backend_fault))  # a prompt of its own: the owner caches them
    failures = ray.get(reader.stats.remote())["failures"].get("checksum", 0)
    fault_free = ray.get(reader.generate.remote(prompt, PARAMS))  # prefilled and decoded here
    _, owner_blocks = ray.get(owner.prefill.remote(prompt))
    export = ray.get(owner.export.remote(owner_blocks))
    reader_blocks = ray.get(reader.reserve.remote("pulled", prompt, PARAMS))
    with pytest.raises(KVIntegrityError, match="landed wrong"):
        ray.get(reader.pull.remote(export, reader_blocks))
    assert ray.get(reader.stats.remote())["failures"] == {"checksum": failures + 1}
    # What the decode replica does on a failed transfer: prefill the prompt itself.
    assert ray.get(reader.recompute.remote("pulled")) == fault_free
    _both_pools_whole(owner, reader, export)


@needs_nixl
def test_integrity_a_block_two_leases_share_is_read_after_the_first_lease_ends(pairs):
    # Two prefills of one prompt share its cached full blocks; the first lease's end must not
    # move their generation on while the second still pins them.
    owner, reader = pairs("nixl", "none")
    prompt = _prompt(len(CASES))
    failures = ray.get(reader.stats.remote())["failures"]
    fault_free = ray.get(reader.generate.remote(prompt, PARAMS))
    _, first_blocks = ray.get(owner.prefill.remote(prompt))
    first = ray.get(owner.export.remote(first_blocks))
    token, second_blocks = ray.get(owner.prefill.remote(prompt))
    second = ray.get(owner.export.remote(second_blocks))
    assert set(first_blocks) & set(second_blocks)
    ray.get(owner.drop_lease.remote(first.lease_id))
    ray.get(owner.poll.remote())
    reader_blocks = ray.get(reader.reserve.remote("shared", prompt, PARAMS))
    ray.get(reader.pull.remote(second, reader_blocks))
    tokens, _ = ray.get(reader.decode.remote("shared", token))
    assert tokens == fault_free[0]
    assert ray.get(reader.stats.remote())["failures"] == failures
    ray.get(reader.poll.remote())  # the reader's own bookkeeping: the pulled request finished
    _both_pools_whole(owner, reader, second)
