"""Shared fixtures: the built-in tiny model, made once per test session."""

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pdserve.cluster.make_model import make_model

    return make_model("tiny", tmp_path_factory.mktemp("models") / "tiny")
