"""``pdserve serve``'s flags and files into a ``ClusterConfig``: a planner without a Prometheus
of its own reads the one ``pdserve serve`` starts on ``--prometheus-port``."""

import argparse
from pathlib import Path

import yaml

from pdserve.cluster import serve


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    return parser.parse_args(argv)


def test_the_planner_flag_bounds_the_pools_and_points_at_the_local_prometheus(
    tiny_model_dir: Path,
) -> None:
    args = _args(
        "--model", str(tiny_model_dir), "--planner", "--profile", "p.json",
        "--max-replicas", "3", "--prometheus-port", "9191",
    )  # fmt: skip
    config = serve.cluster_config(args)
    assert config.planner.enabled and config.planner.profile == "p.json"
    assert config.planner.prometheus_url == "http://127.0.0.1:9191"
    (model,) = config.models
    assert (model.prefill.lowest, model.prefill.highest) == (1, 3)
    assert (model.decode.lowest, model.decode.highest) == (1, 3)


def test_a_file_enabling_the_planner_reads_the_local_prometheus_unless_it_names_one(
    tmp_path: Path,
) -> None:
    raw = {
        "models": [{"name": "m", "path": "/models/m"}],
        "planner": {"enabled": True, "profile": "p.json"},
    }
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert serve.cluster_config(_args("--config", str(path))).planner.prometheus_url == (
        "http://127.0.0.1:9090"
    )
    raw["planner"]["prometheus_url"] = "http://prometheus:9090"
    path.write_text(yaml.safe_dump(raw))
    config = serve.cluster_config(_args("--config", str(path)))
    assert config.planner.prometheus_url == "http://prometheus:9090"


def test_without_the_planner_the_pools_stay_put(tiny_model_dir: Path) -> None:
    config = serve.cluster_config(_args("--model", str(tiny_model_dir), "--decode-replicas", "2"))
    assert not config.planner.enabled and config.planner.prometheus_url is None
    (model,) = config.models
    assert (model.decode.lowest, model.decode.replicas, model.decode.highest) == (2, 2, 2)
