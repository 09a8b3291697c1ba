"""Who may call the API: keys from the config and ``PDSERVE_API_KEY`` (one or several, comma
separated), each once; the warning when the API is open to other machines."""

import pytest

from pdserve.cluster.access import API_KEY_ENV, api_keys, env_api_keys, is_loopback, warn_if_open
from pdserve.serving.config import ClusterConfig

MODELS = [{"name": "m", "path": "/models/m"}]


@pytest.mark.parametrize(
    ("value", "keys"),
    [
        ("sk-one", ["sk-one"]),
        ("sk-one,sk-two", ["sk-one", "sk-two"]),
        (" sk-one , sk-two ,", ["sk-one", "sk-two"]),
        ("", []),
    ],
)
def test_the_env_var_holds_one_key_or_several(value: str, keys: list[str]) -> None:
    assert env_api_keys({API_KEY_ENV: value}) == keys


def test_no_env_var_no_keys() -> None:
    assert env_api_keys({}) == []


def test_config_and_env_keys_are_merged_each_once() -> None:
    config = ClusterConfig(models=MODELS, api_keys=["sk-one", "sk-two"])
    environ = {API_KEY_ENV: "sk-two,sk-three"}
    assert api_keys(config, environ) == ["sk-one", "sk-two", "sk-three"]


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("10.1.2.3", False),
        ("example.com", False),
    ],
)
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_an_open_api_is_warned_about_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    config = ClusterConfig(models=MODELS, http_host="0.0.0.0", http_port=8123, grpc_port=9123)
    assert warn_if_open(config, {})
    err = capsys.readouterr().err
    assert "warning" in err and "0.0.0.0:8123" in err and "9123" in err and API_KEY_ENV in err


def test_an_http_host_on_loopback_still_warns_for_grpc(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Serve's gRPC proxy listens on every interface whatever the HTTP host.
    config = ClusterConfig(models=MODELS, http_host="127.0.0.1", grpc_port=9123)
    assert warn_if_open(config, {})
    err = capsys.readouterr().err
    assert "9123" in err and "HTTP" not in err


@pytest.mark.parametrize("source", ["config", "env"])
def test_any_key_silences_the_warning(source: str, capsys: pytest.CaptureFixture[str]) -> None:
    keys = {"api_keys": ["sk-one"]} if source == "config" else {}
    environ = {API_KEY_ENV: "sk-one"} if source == "env" else {}
    assert not warn_if_open(ClusterConfig(models=MODELS, **keys), environ)
    assert capsys.readouterr().err == ""


def test_keys_never_show_in_the_config_printed_or_dumped() -> None:
    config = ClusterConfig(models=MODELS, api_keys=["sk-secret"])
    assert "sk-secret" not in repr(config) and "sk-secret" not in str(config)
    assert "sk-secret" not in config.model_dump_json()
    assert api_keys(config, {}) == ["sk-secret"]
