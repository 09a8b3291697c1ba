"""Checked KV without a peer: the checksums and generations a pull is checked against, the faults
the integrity tests inject, and how a block that landed wrong is counted."""

import pickle

import pydantic
import pytest
import torch

from pdserve.kvtransfer import faults
from pdserve.kvtransfer.handles import KVExport, KVIntegrityError, KVTransferError
from pdserve.kvtransfer.integrity import block_checksums, check_checksums, check_generations
from pdserve.kvtransfer.leases import LeaseTable
from pdserve.kvtransfer.stats import TransferStats
from pdserve.kvtransfer.transfer import Transfer
from pdserve.serving.config import KVTransferConfig

# [blocks, layers, K/V, block_size, kv_heads, head_dim], the engine's block-major layout
SHAPE = (6, 2, 2, 4, 2, 8)


def cache(dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(SHAPE, generator=torch.Generator().manual_seed(0)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_integrity_checksums_follow_each_block_s_bytes(dtype) -> None:
    kv = cache(dtype)
    checksums = block_checksums(kv, [3, 1, 4])
    assert checksums == block_checksums(kv.clone(), [3, 1, 4])
    assert len(set(checksums)) == 3
    check_checksums("pull", kv, [3, 1, 4], checksums)


@pytest.mark.parametrize("fault", [faults.flip_a_bit, faults.overwrite])
def test_integrity_a_corrupt_or_overwritten_block_fails_its_checksum(fault) -> None:
    kv = cache()
    checksums = block_checksums(kv, [2, 5])
    fault(kv, 5)
    with pytest.raises(KVIntegrityError, match="block 1 of the pull differs from its checksum"):
        check_checksums("pull", kv, [2, 5], checksums)
    check_checksums("pull", kv, [2], checksums[:1])  # the other block is untouched


def test_integrity_a_block_freed_under_the_read_fails_its_generation() -> None:
    check_generations("pull", [3, 0], [3, 0])
    with pytest.raises(KVIntegrityError, match="block 0 of the pull was freed by its owner"):
        check_generations("pull", [4, 0], [3, 0])


def test_integrity_failure_is_counted_by_reason_checksum() -> None:
    stats = TransferStats()

    def landed_wrong() -> bool:
        check_generations("pull", [1], [0])
        return True

    transfer = Transfer("pull", landed_wrong, 10.0, stats, 1, 64)
    with pytest.raises(KVTransferError):
        transfer.poll()
    assert stats.failures == {"checksum": 1} and stats.num_transfers == 0


def test_integrity_export_keeps_checksums_and_generations_across_processes() -> None:
    export = KVExport("owner", (1, 2), "owner:0", 30.0, checksums=(7, 8), generations=(0, 3))
    arrived = pickle.loads(pickle.dumps(export))
    assert (arrived.checksums, arrived.generations) == ((7, 8), (0, 3))


def test_integrity_a_block_two_leases_pin_stays_pinned_until_both_end() -> None:
    freed: list[list[int]] = []
    leases = LeaseTable(freed.append, "owner")
    first, second = leases.grant([1, 2], 30.0), leases.grant([2, 3], 30.0)
    leases.release(first)
    assert freed == [[1, 2]]
    assert not leases.is_pinned(1) and leases.is_pinned(2) and leases.is_pinned(3)
    leases.release(second)
    assert not any(leases.is_pinned(i) for i in (1, 2, 3))


def test_integrity_is_checked_by_default_and_faults_are_off() -> None:
    config = KVTransferConfig()
    assert config.verify and config.fault_injection == "none"
    with pytest.raises(pydantic.ValidationError):
        KVTransferConfig(fault_injection="flip")
    with pytest.raises(pydantic.ValidationError):
        KVTransferConfig(fault_injection="corrupt", fault_every=0)


def test_integrity_a_fault_every_third_transfer_hits_the_third_and_sixth_of_its_role() -> None:
    schedule = faults.FaultSchedule("corrupt", every=3)
    # Exports ask for their faults too: only the reader's pulls count towards "corrupt".
    hits = [(schedule.hits("free_early"), schedule.hits("corrupt"))[1] for _ in range(7)]
    assert hits == [False, False, True, False, False, True, False]
    assert not any(faults.FaultSchedule().hits("corrupt") for _ in range(4))
