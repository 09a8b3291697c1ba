"""transformers' greedy continuations: the reference every engine path must equal."""

from collections.abc import Sequence
from pathlib import Path

import torch
import transformers


def hf_greedy(model_dir: Path, requests: Sequence[tuple[list[int], int]]) -> list[list[int]]:
    """For each (prompt, number of new tokens), run alone (a batch of one, no padding)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    # No EOS: like ignore_eos, generation neither stops at nor masks the EOS ids, so every
    # output has its exact length and EOS stays a legal greedy pick on both sides.
    model.generation_config.eos_token_id = None
    outputs = []
    for prompt, num_new in requests:
        ids = torch.tensor([prompt])
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=num_new
        )
        outputs.append(out[0, len(prompt) :].tolist())
    return outputs
