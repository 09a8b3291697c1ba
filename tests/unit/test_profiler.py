"""``pdserve profile`` on the tiny model at a small grid: a profile the planner can load, with
times that grow with the work, and its plot."""

from pathlib import Path

import pytest

from pdserve.cluster import cli
from pdserve.cluster.planner.profile import Profile


@pytest.mark.slow  # profiles the model on a grid
def test_profile_writes_what_the_planner_reads(
    tiny_model_dir: Path, tmp_path: Path, torch_threads
) -> None:
    out = tmp_path / "profile.json"
    argv = ["profile", "--model", str(tiny_model_dir), "--out", str(out), "--threads", "1"]
    # Grid points far apart in work (32 times the prompt, 64 times the sequences), so that their
    # times are ordered however busy the cores are (16 decodes a step took less than one, once,
    # on the tiny model beside make test's other runs).
    argv += ["--prefill-tokens", "16", "512", "--decode-batches", "1", "64"]
    argv += ["--decode-contexts", "64", "256"]
    assert cli.main(argv) == 0
    profile = Profile.load(out)
    assert profile.model == tiny_model_dir.name and profile.meta["threads"] == 1
    assert [p.tokens for p in profile.prefill] == [16, 512]
    assert profile.batches == [1, 64] and profile.contexts == [64, 256]
    assert all(p.seconds > 0 for p in (*profile.prefill, *profile.decode))
    # A 512-token prompt costs more than a 16-token one; 64 decodes a step more than one.
    assert profile.prefill_seconds(512) > profile.prefill_seconds(16)
    assert profile.decode_step_seconds(64, 256) > profile.decode_step_seconds(1, 256)
    pytest.importorskip("matplotlib")
    assert out.with_suffix(".png").stat().st_size > 0


@pytest.mark.slow
def test_grid_points_the_model_cannot_serve_are_skipped(
    tiny_model_dir: Path, tmp_path: Path, torch_threads, capsys: pytest.CaptureFixture[str]
) -> None:
    # The tiny model serves 2048 tokens: the default grid's 2048-token prompt does not fit.
    out = tmp_path / "profile.json"
    argv = ["profile", "--model", str(tiny_model_dir), "--out", str(out), "--threads", "1"]
    argv += ["--decode-batches", "1", "2"]
    grid = ["--prefill-tokens", "16", "64", "2048", "--decode-contexts", "64", "2040"]
    assert cli.main([*argv, *grid]) == 0
    assert "skipping [2048, 'context 2040']" in capsys.readouterr().out
    profile = Profile.load(out)
    assert [p.tokens for p in profile.prefill] == [16, 64] and profile.contexts == [64]
    too_long = ["--prefill-tokens", "4096", "--decode-contexts", "64"]
    with pytest.raises(ValueError, match="no point of the grid fits"):
        cli.main([*argv, *too_long])
