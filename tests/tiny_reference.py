"""The batching-invariance workload on the built-in tiny model, and transformers' greedy tokens
for it, recorded (``transformers_record``): transformers decodes its 64 requests alone in ~50 s
of one core, beside make test's other runs. ``make references`` writes the record again
(``python -m pdserve.tests.tiny_reference``).

64 requests of random token ids, prompt lengths 1..512 and output lengths 1..200, each evenly
spread over its range (ends included), paired and ordered at random.
"""

import json
import tempfile
from pathlib import Path

import torch

from pdserve.cluster.make_model import make_model
from pdserve.engine.config import ModelConfig
from pdserve.tests import transformers_record
from pdserve.tests.hf_reference import hf_greedy

RECORD = "tiny_transformers_greedy.json"
NUM_REQUESTS = 64
MIN_PROMPT_LEN, MAX_PROMPT_LEN = 1, 512
MIN_OUTPUT_LEN, MAX_OUTPUT_LEN = 1, 200
SEED = 0

# (prompt token ids, number of output tokens) per request.
Workload = list[tuple[list[int], int]]


def batching_workload(model_dir: Path) -> Workload:
    vocab_size = ModelConfig.from_pretrained(model_dir).vocab_size
    g = torch.Generator().manual_seed(SEED)
    prompt_lens = torch.linspace(MIN_PROMPT_LEN, MAX_PROMPT_LEN, NUM_REQUESTS).round().long()
    output_lens = torch.linspace(MIN_OUTPUT_LEN, MAX_OUTPUT_LEN, NUM_REQUESTS).round().long()
    prompt_lens = prompt_lens[torch.randperm(NUM_REQUESTS, generator=g)].tolist()
    output_lens = output_lens[torch.randperm(NUM_REQUESTS, generator=g)].tolist()
    return [
        (torch.randint(0, vocab_size, (n,), generator=g).tolist(), m)
        for n, m in zip(prompt_lens, output_lens, strict=True)
    ]


def _inputs(model_dir: Path, workload: Workload) -> dict[str, object]:
    """What the tokens depend on besides transformers: the model's files, the requests."""
    return {
        "config_sha256": transformers_record.digest((model_dir / "config.json").read_bytes()),
        "weights_sha256": transformers_record.digest(
            (model_dir / "model.safetensors").read_bytes()
        ),
        "workload_sha256": transformers_record.digest(json.dumps(workload).encode()),
    }


def recorded(model_dir: Path, workload: Workload) -> list[list[int]]:
    """The recorded tokens (an AssertionError naming the refresh if made from other inputs)."""
    return transformers_record.recorded(RECORD, _inputs(model_dir, workload))


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = make_model("tiny", Path(scratch) / "tiny")
        workload = batching_workload(model_dir)
        tokens = hf_greedy(model_dir, workload)
        print(f"wrote {transformers_record.write(RECORD, _inputs(model_dir, workload), tokens)}")
