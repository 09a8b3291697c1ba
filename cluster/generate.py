"""Generate offline with the engine: prompts in, completions printed (no cluster)."""

import argparse
from pathlib import Path

from pdserve.cluster.engine_flags import add_engine_arguments, engine_section
from pdserve.cluster.served_model import default_model
from pdserve.engine.llm import LLM
from pdserve.engine.sampling_params import SamplingParams

# `--seed` here is the requests' own seed (vLLM's sampling `seed`), not the engine's; the flags
# below set the request's sampling fields, so a model's defaults for them have nothing to fill.
NOT_ENGINE_FLAGS = frozenset({"seed", "generation_config", "override_generation_config"})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        type=Path,
        help="an HF checkpoint folder or a GGUF file (default: SmolLM2-135M-Instruct)",
    )
    parser.add_argument("--prompt", action="append", required=True, help="repeat for a batch")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=None)
    add_engine_arguments(parser, skip=NOT_ENGINE_FLAGS)


def run(args: argparse.Namespace) -> int:
    model = args.model or default_model()
    llm = LLM(model=str(model), **engine_section(args, skip=NOT_ENGINE_FLAGS))
    params = SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed
    )
    for output in llm.generate(args.prompt, params):
        print(f"prompt:  {output.prompt!r}")
        print(f"output:  {output.text!r}")
        print(f"tokens:  {len(output.token_ids)}, finish_reason: {output.finish_reason}\n")
    return 0
