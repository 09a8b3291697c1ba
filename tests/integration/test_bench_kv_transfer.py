"""The KV-transfer benchmark, end to end at a tiny size on the session's cluster: every mode runs
and lands bit-identical."""

import subprocess
import sys
from pathlib import Path

import pytest

from pdserve.benchmarks import kv_transfer as bench

TOKENS = (16, 64)  # 1 and 4 blocks of 16 tokens


def test_reader_block_ids_are_distinct_and_not_the_owners() -> None:
    ids = bench.reader_block_ids(64, seed=0)
    assert len(set(ids)) == 64 and all(0 <= i < 128 for i in ids)
    assert ids != list(range(64)) and ids == bench.reader_block_ids(64, seed=0)


@pytest.mark.slow  # two Ray actors, and a transfer in each mode
def test_every_mode_reports_and_lands_bit_identical(ray_cluster, tiny_model_dir: Path) -> None:
    pdserve = Path(sys.executable).with_name("pdserve")
    argv = ["--model", str(tiny_model_dir), "--repeats", "1", "--warmup", "1"]
    argv += ["--address", ray_cluster.address, "--tokens", *map(str, TOKENS)]
    run = subprocess.run(
        [str(pdserve), "bench", "kv-transfer", *argv], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    rows = [line for line in run.stdout.splitlines() if line.startswith("| ")]
    modes = [bench.COPY, bench.INDEXED_COPY, *bench.TRANSFERS]
    for tokens in TOKENS:
        for mode in modes:
            [row] = [r for r in rows if r.startswith(f"| {tokens} |") and f"| {mode} |" in r]
            assert row.endswith("| yes |"), row
