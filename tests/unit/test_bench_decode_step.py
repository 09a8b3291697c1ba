"""``pdserve bench decode-step`` stays runnable: its table has a row per batch size with our step,
transformers' and, where the native kernels are built, the PyTorch kernels' baseline; ``--profile``
lists a step's ops."""

import re

import pytest

from pdserve.benchmarks import decode_step
from pdserve.cluster import cli
from pdserve.kernels import native

pytestmark = pytest.mark.slow


def test_decode_step_table_and_profile(tiny_model_dir, capsys):
    argv = ["bench", "decode-step", "--model", str(tiny_model_dir), "--batch-sizes", "1", "3"]
    module, args = cli.dispatch(
        "pdserve", cli.SUBCOMMANDS, [*argv, "--steps", "2", "--profile", "4"]
    )
    assert module is decode_step
    assert module.run(args) == 0
    out = capsys.readouterr().out
    rows = re.findall(r"^\| (\d+) \| ([\d.]+) \| \d+% \| ([\d.]+) \|", out, re.MULTILINE)
    assert [batch for batch, _, _ in rows] == ["1", "3"]
    assert all(float(ours) > 0 and float(theirs) > 0 for _, ours, theirs in rows)
    assert ("PyTorch kernels ms/step" in out) == native.available()
    profiles = re.findall(r"top 4 ops by self CPU time:\n\| op .*\n\|---.*\n((?:\| .*\n){4})", out)
    assert len(profiles) == 2
    assert any("linear" in table or "mm" in table for table in profiles)
