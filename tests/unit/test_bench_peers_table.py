"""``bench peers``' table: both servers' figures at each concurrency, then pdserve's over
llama.cpp's; and the llama.cpp build's name changes with the CPU's features and its options (no
AMX kernels where the CPU has AMX)."""

import pytest

from pdserve.benchmarks.peers import llama_cpp
from pdserve.benchmarks.peers.llama_cpp import cmake_options, cpu_key, server_argv
from pdserve.benchmarks.peers.table import OURS, PEER, peers_table


def _summary(tok_s: float, ttft: float, itl: float, failed: int = 0) -> dict:
    return {
        "output_throughput": tok_s,
        "p50_ttft_ms": ttft,
        "p50_itl_ms": itl,
        "p90_itl_ms": 2 * itl,
        "completed": 8 - failed,
        "failed": failed,
    }


def test_rows_per_level_and_the_ratio_of_ours_over_the_peers() -> None:
    lines = peers_table(
        {
            "1": {PEER: _summary(33.4, 329.0, 27.3), OURS: _summary(16.7, 357.0, 54.6)},
            "16": {PEER: _summary(95.6, 3685.0, 111.1, 2), OURS: _summary(191.2, 1842.5, 55.55)},
        }
    )
    assert lines[0].startswith("| concurrency | server | out tok/s | TTFT p50 ms | ITL p50 ms |")
    assert lines[2] == "| 1 | llama.cpp | 33.40 | 329.00 | 27.30 | 54.60 | 8 | 0 |"
    assert lines[3] == "| 1 | pdserve | 16.70 | 357.00 | 54.60 | 109.20 | 8 | 0 |"
    assert lines[4] == "| 1 | pdserve / llama.cpp | 0.50x | 1.09x | 2.00x | 2.00x | | |"
    assert lines[5] == "| 16 | llama.cpp | 95.60 | 3685.00 | 111.10 | 222.20 | 6 | 2 |"
    assert lines[7] == "| 16 | pdserve / llama.cpp | 2.00x | 0.50x | 0.50x | 0.50x | | |"
    assert len(lines) == 8


def test_the_server_command_uses_the_given_threads_slots_and_context() -> None:
    argv = server_argv("llama-server", "m.gguf", 8123, 2, 16, 8192)
    pairs = dict(zip(argv[1::2], argv[2::2], strict=False))
    assert pairs["--threads"] == pairs["--threads-batch"] == "2"
    assert (pairs["--parallel"], pairs["--ctx-size"], pairs["--port"]) == ("16", "8192", "8123")
    assert pairs["--host"] == "127.0.0.1" and pairs["--model"] == "m.gguf"
    assert cpu_key() == cpu_key() and len(cpu_key().rsplit("-", 1)[1]) == 8


@pytest.mark.parametrize("amx", [False, True])
def test_a_cpu_with_amx_builds_without_its_kernels_and_apart(
    amx: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    flags = ["avx512f", "avx512_vnni"] + (["amx_tile", "amx_int8"] if amx else [])
    monkeypatch.setattr(llama_cpp, "cpu_flags", lambda: flags)
    options = cmake_options()
    assert options["GGML_NATIVE"] == "ON"
    for name in ("CMAKE_C_FLAGS", "CMAKE_CXX_FLAGS"):
        assert ("-mno-amx-int8" in options.get(name, "")) is amx
    with_options = cpu_key()
    monkeypatch.setattr(llama_cpp, "cmake_options", lambda: llama_cpp.CMAKE_OPTIONS)
    assert (cpu_key() != with_options) is amx  # another build folder
