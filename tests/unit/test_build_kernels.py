"""``pdserve build-kernels``: no compiler is not an error (the PyTorch kernels serve); sources that
do not compile are."""

import argparse
from pathlib import Path

import pytest

from pdserve.cluster import build_kernels
from pdserve.kernels import native


def _failing(error: Exception):
    def build() -> Path:
        raise error

    return build


def test_no_compiler_exits_0(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setattr(native, "build", _failing(native.NoCompiler("no C++ compiler (c++)")))
    assert build_kernels.run(argparse.Namespace()) == 0
    assert "not built: no C++ compiler" in capsys.readouterr().out


def test_sources_that_do_not_compile_exit_1(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setattr(native, "build", _failing(RuntimeError("Error building extension")))
    assert build_kernels.run(argparse.Namespace()) == 1
    assert "did not compile: Error building extension" in capsys.readouterr().out


def test_no_compiler_is_what_build_raises_without_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    with pytest.raises(native.NoCompiler):
        native.build()
