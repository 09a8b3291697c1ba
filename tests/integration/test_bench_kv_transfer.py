"""The KV-transfer benchmark, end to end at a tiny size: every mode runs and lands bit-identical."""

from pathlib import Path

import pytest

from pdserve.benchmarks import kv_transfer as bench
from pdserve.cluster import cli

TOKENS = (16, 64)  # 1 and 4 blocks of 16 tokens


def test_reader_block_ids_are_distinct_and_not_the_owners() -> None:
    ids = bench.reader_block_ids(64, seed=0)
    assert len(set(ids)) == 64 and all(0 <= i < 128 for i in ids)
    assert ids != list(range(64)) and ids == bench.reader_block_ids(64, seed=0)


@pytest.mark.slow  # Ray and two actors: ~45 s on a busy 2-core machine
def test_every_mode_reports_and_lands_bit_identical(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--model", str(tiny_model_dir), "--repeats", "1", "--warmup", "1", "--tokens"]
    assert cli.main(["bench", "kv-transfer", *argv, *map(str, TOKENS)]) == 0

    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    modes = [bench.COPY, bench.INDEXED_COPY, *bench.TRANSFERS]
    for tokens in TOKENS:
        for mode in modes:
            [row] = [r for r in rows if r.startswith(f"| {tokens} |") and f"| {mode} |" in r]
            assert row.endswith("| yes |"), row
