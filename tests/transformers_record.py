"""transformers' greedy tokens, recorded in ``data/``.

Where transformers, decoding each prompt alone, takes longer than ``make test`` can give it beside
its other runs, ``make test`` holds pdserve's tokens equal to a record, and the record's own test
(marker ``transformers_anew``: ``make test-real-model``, and ``make test-newest`` on the newest
transformers) holds the record equal to transformers run anew. A record names what its tokens
were made from (digests of the weights and the prompts, the lengths): read for other inputs, it
fails, naming the command that writes it again.
"""

import hashlib
import importlib.metadata
import json
from pathlib import Path

DATA = Path(__file__).with_name("data")
REFRESH = "make references"
VERSIONS = ("transformers", "torch", "gguf")  # what made a record, for whoever reads it


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def recorded(name: str, inputs: dict[str, object]) -> list[list[int]]:
    """The tokens of record ``name``; an AssertionError naming the refresh if they were made
    from other ``inputs``."""
    record = json.loads((DATA / name).read_text())
    made_from = {key: record.get(key) for key in inputs}
    assert made_from == inputs, f"{name} was made from other weights, prompts or lengths: {REFRESH}"
    return record["tokens"]


def write(name: str, inputs: dict[str, object], tokens: list[list[int]]) -> Path:
    """Writes record ``name``: the tokens, the inputs they were made from, the versions."""
    versions = {package: importlib.metadata.version(package) for package in VERSIONS}
    DATA.mkdir(exist_ok=True)
    path = DATA / name
    path.write_text(json.dumps({**inputs, "versions": versions, "tokens": tokens}, indent=1) + "\n")
    return path
