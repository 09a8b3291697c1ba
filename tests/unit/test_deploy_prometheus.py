"""``deploy/prometheus/`` passes Prometheus' own checker (``promtool``, Debian package
``prometheus``, which ``make test`` installs)."""

import shutil
import subprocess
from pathlib import Path

import pytest

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
