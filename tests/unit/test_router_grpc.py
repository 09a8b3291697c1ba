"""The gRPC modules are generated from the .proto (fresh, importable by package path), and the
servicer implements exactly the rpcs it declares, under their names."""

import inspect
import os
import shutil
from pathlib import Path

import pytest

from pdserve.router.api import grpc_codegen
from pdserve.router.api.grpc_service import GenerationServicer, pb, pb_grpc

RPCS = {"Generate", "Complete", "ListModels", "Health"}


def test_generated_code_is_fresh_and_imports_by_package_path() -> None:
    assert not grpc_codegen.is_stale()
    assert pb.__name__ == "pdserve.router.api._generated.pdserve_pb2"
    assert pb_grpc.__name__ == "pdserve.router.api._generated.pdserve_pb2_grpc"
    assert pb_grpc.pdserve_dot_router_dot_api_dot___generated_dot_pdserve__pb2 is pb


def test_generation_writes_the_modules_and_a_newer_proto_makes_them_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proto = tmp_path / "pdserve.proto"
    shutil.copyfile(grpc_codegen.PROTO, proto)
    out = tmp_path / "_generated"
    monkeypatch.setattr(grpc_codegen, "PROTO", proto)
    monkeypatch.setattr(grpc_codegen, "OUTPUT_DIR", out)
    monkeypatch.setattr(grpc_codegen, "STAMP", out / "pdserve_pb2_grpc.py")
    assert grpc_codegen.is_stale()  # nothing generated yet
    grpc_codegen.generate()
    assert not grpc_codegen.is_stale()
    assert sorted(p.name for p in out.iterdir()) == [
        "__init__.py",
        "pdserve_pb2.py",
        "pdserve_pb2.pyi",
        "pdserve_pb2_grpc.py",
    ]
    assert (
        "from pdserve.router.api._generated import pdserve_pb2"
        in (out / "pdserve_pb2_grpc.py").read_text()
    )
    later = (out / "pdserve_pb2_grpc.py").stat().st_mtime + 1
    os.utime(proto, (later, later))
    assert grpc_codegen.is_stale()


def test_servicer_methods_are_the_rpcs() -> None:
    service = pb.DESCRIPTOR.services_by_name["Generation"]
    assert set(service.methods_by_name) == RPCS
    public = {name for name, _ in inspect.getmembers(GenerationServicer) if name[0].isupper()}
    assert public == RPCS
    for name in RPCS:
        method = getattr(GenerationServicer, name)
        # Serve calls deployment methods with the request and a `grpc_context` keyword.
        assert list(inspect.signature(method).parameters) == ["self", "request", "grpc_context"]
    assert inspect.isasyncgenfunction(GenerationServicer.Generate)
    assert service.methods_by_name["Generate"].server_streaming
