"""The engine's memory stays bounded however many row counts its steps bring: oneDNN's primitive
cache and ideep's are bounded (``engine/linear.py``, ``bound_onednn_caches``). Each run is a fresh
interpreter, since each cache reads its bound once; with torch's own bound (1,024 entries each),
the same prompts grow the process by over a hundred MiB."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pdserve.engine.linear import ONEDNN_CACHE_ENV

pytestmark = pytest.mark.slow  # two fresh interpreters and an engine each

TORCH_DEFAULT_ENTRIES = 1024
PROMPT_LENGTHS = range(17, 117)  # one prompt a step: a row count oneDNN has not seen, each
LENGTHS = json.dumps(list(PROMPT_LENGTHS))
BOUNDED_GROWTH_MIB = 80
UNBOUNDED_GROWTH_MIB = 150  # what the same prompts cost with torch's bound: the check can fail

# Resident memory after glibc gives back what it can, before and after the prompts.
SCRIPT = """
import ctypes, json, sys
from pdserve import LLM, SamplingParams
from pdserve.serving.replica import resident_set_bytes

def resident_mib():
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return resident_set_bytes() / 2**20

llm = LLM(model=sys.argv[1], enable_prefix_caching=False)
params = SamplingParams(temperature=0.0, max_tokens=1)
llm.generate([[7] * 8], params)
before = resident_mib()
for n in json.loads(sys.argv[2]):
    llm.generate([[(5 * i) % 4000 + 3 for i in range(n)]], params)
print(json.dumps(resident_mib() - before))
"""


def _growth_mib(model_dir: Path, env: dict[str, str]) -> float:
    result = subprocess.run(
        [sys.executable, "-P", "-c", SCRIPT, str(model_dir), LENGTHS],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


@pytest.mark.timeout(300)
def test_new_row_counts_do_not_grow_the_engine_without_bound(tiny_model_dir: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ONEDNN_CACHE_ENV}
    bounded = _growth_mib(tiny_model_dir, env)
    unbounded = _growth_mib(
        tiny_model_dir, {**env, **dict.fromkeys(ONEDNN_CACHE_ENV, str(TORCH_DEFAULT_ENTRIES))}
    )
    assert unbounded > UNBOUNDED_GROWTH_MIB, (bounded, unbounded)
    assert bounded < BOUNDED_GROWTH_MIB, (bounded, unbounded)
