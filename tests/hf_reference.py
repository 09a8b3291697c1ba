"""transformers' greedy continuations: the reference every engine path must equal."""

from collections.abc import Sequence
from pathlib import Path

import torch
import transformers


def hf_greedy(
    model_dir: Path, requests: Sequence[tuple[list[int], int]], gguf_file: str | None = None
) -> list[list[int]]:
    """For each (prompt, number of new tokens), run alone (a batch of one, no padding); with
    ``gguf_file``, the model is transformers' GGUF load of that file in ``model_dir``.

    What ``generate(do_sample=False)`` does, written out: the model's forward over the prompt,
    then one token at a time over transformers' own KV cache, taking the argmax of the last
    position's logits, without generate's per-step machinery (half the time on the tiny model,
    the same tokens). No EOS: every output has its exact length and EOS stays a legal pick, as
    with the engine's ``ignore_eos``.
    """
    model = transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, gguf_file=gguf_file, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    outputs, threads = [], torch.get_num_threads()
    # On one thread: as fast as on two on the tiny model, and faster beside another busy process
    # (make test runs two), where two threads wait on each other (docs/benchmarks.md).
    torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            for prompt, num_new in requests:
                cache, ids, out = transformers.DynamicCache(), torch.tensor([prompt]), []
                for _ in range(num_new):
                    step = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
                    out.append(int(step.logits[0, -1].argmax()))
                    ids = torch.tensor([[out[-1]]])
                outputs.append(out)
    finally:
        torch.set_num_threads(threads)
    return outputs
