"""``deploy/prometheus/`` passes Prometheus' own checker (``promtool``, Debian package
``prometheus``, which ``make test`` installs)."""

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from pdserve.cluster.prometheus import CONFIG, config_reading_ray_files_in

PROMETHEUS = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"

pytestmark = pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="needs promtool: Debian package `prometheus` (make test installs it)",
)


@pytest.mark.parametrize(("check", "file"), [("config", "prometheus.yml"), ("rules", "rules.yml")])
def test_promtool_accepts(check: str, file: str) -> None:
    result = subprocess.run(
        ["promtool", "check", check, str(PROMETHEUS / file)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_refuses_a_broken_rule(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yml"
    rules.write_text("groups:\n  - name: x\n    rules:\n      - record: a:b\n        expr: sum(\n")
    result = subprocess.run(
        ["promtool", "check", "rules", str(rules)], capture_output=True, timeout=60
    )
    assert result.returncode != 0


def test_the_config_for_a_ray_temp_dir_elsewhere_reads_ray_s_file_there(tmp_path: Path) -> None:
    """``RAY_TMPDIR`` moves the file Ray's dashboard lists the metrics agents in: `pdserve serve
    --prometheus` gives Prometheus a copy of the config that reads it there (and the rules)."""
    ray_temp_dir = tmp_path / "elsewhere" / "ray"
    config = config_reading_ray_files_in(CONFIG, ray_temp_dir, tmp_path)
    (job,) = yaml.safe_load(config.read_text())["scrape_configs"]
    (discovery,) = job["file_sd_configs"]
    assert discovery["files"] == [str(ray_temp_dir / "prom_metrics_service_discovery.json")]
    result = subprocess.run(
        ["promtool", "check", "config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout + result.stderr
