"""The checkpoint's generation defaults: the sampling settings of its ``generation_config.json``
become the defaults of every request that leaves them out, as vLLM applies them.

``EngineConfig.generation_config`` (vLLM's ``--generation-config``) says where they come from:
"auto" reads the checkpoint's file (an HF folder's, or one beside a GGUF file, which has none of
its own); "vllm" reads none (``SamplingParams``' neutral defaults); anything else is a folder
holding the file. ``override_generation_config`` entries replace the file's. As in vLLM, a
``max_new_tokens`` the operator chose (in the override, or in the file of a named folder) also
caps every request's ``max_tokens``. Only JSON is read: the router, which imports no torch, builds
the requests' ``SamplingParams``.
"""

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdserve.engine.checkpoint_format import GENERATION_CONFIG_FILE, gguf_file
from pdserve.engine.config import (
    GENERATION_CONFIG_AUTO,
    GENERATION_CONFIG_NAMES,
    GENERATION_CONFIG_NONE,
    EngineConfig,
)
from pdserve.engine.errors import CheckpointError
from pdserve.engine.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

# The file's keys vLLM takes as request defaults, by the SamplingParams field each one sets.
DEFAULT_KEYS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",  # HF's name for it
}
# The file's keys that are no sampling setting: token ids (its EOS ids stop generation:
# tokenizer.py) and transformers' bookkeeping. Any other key is a setting left unapplied.
NOT_SAMPLING_KEYS = frozenset(
    {
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "decoder_start_token_id",
        "transformers_version",
        "_from_model_config",
    }
)


@dataclass(frozen=True)
class GenerationDefaults:
    """What a request gets for the sampling fields it leaves out, instead of SamplingParams'
    own defaults."""

    sampling: dict[str, Any] = field(default_factory=dict)  # temperature, top_p, top_k, ...
    max_tokens: int | None = None  # for a request without one (None: what the context leaves)
    max_tokens_cap: int | None = None  # caps even a request's own max_tokens (vLLM's override)

    def fill(self, given: dict[str, Any]) -> dict[str, Any]:
        """The request's own sampling fields (``given``), the defaults for those it left out."""
        return {**self.sampling, **given}


def load_generation_defaults(config: EngineConfig) -> GenerationDefaults:
    """The defaults ``config`` asks for, logged when there are any; a file that cannot give them
    (missing from a named folder, not a JSON object, a value SamplingParams refuses) raises
    ``CheckpointError``."""
    source = config.generation_config
    file = None if source == GENERATION_CONFIG_NONE else _file(config.model, source)
    override = config.override_generation_config or {}
    raw = {**(_read(file) if file is not None else {}), **override}
    taken = {DEFAULT_KEYS[k]: v for k, v in raw.items() if k in DEFAULT_KEYS and v is not None}
    chosen = override if source in GENERATION_CONFIG_NAMES else raw
    defaults = GenerationDefaults(
        sampling={k: v for k, v in taken.items() if k != "max_tokens"},
        max_tokens=taken.get("max_tokens"),
        max_tokens_cap=chosen.get("max_new_tokens"),
    )
    sources = ([str(file)] if file is not None else []) + (["the override"] if override else [])
    where = " and ".join(sources)
    try:
        SamplingParams(**taken)
        if defaults.max_tokens_cap is not None:
            SamplingParams(max_tokens=defaults.max_tokens_cap)
    except (ValueError, TypeError) as error:
        raise CheckpointError(f"generation defaults of {where}: {error}") from error
    unapplied = sorted(set(raw) - set(DEFAULT_KEYS) - NOT_SAMPLING_KEYS)
    if taken or unapplied:
        # vLLM warns too: a model's defaults change what requests without them get.
        logger.log(
            logging.WARNING if taken else logging.INFO,
            "%s: request defaults from %s: %s%s%s",
            config.model,
            where,
            taken or "none",
            f"; not applied: {', '.join(unapplied)}" if unapplied else "",
            "; --generation-config vllm ignores the file" if file is not None else "",
        )
    return defaults


def _file(model: str, source: str) -> Path | None:
    if source != GENERATION_CONFIG_AUTO:
        named = Path(source) / GENERATION_CONFIG_FILE
        if not named.is_file():
            raise CheckpointError(f"generation_config names a folder without the file: {named}")
        return named
    gguf = gguf_file(model)
    # A GGUF file carries no generation config; the folder it lies in may hold one.
    file = (Path(model) if gguf is None else gguf.parent) / GENERATION_CONFIG_FILE
    return file if file.is_file() else None


def _read(file: Path) -> dict[str, Any]:
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except ValueError as error:
        raise CheckpointError(f"{file}: {error}") from error
    if not isinstance(raw, dict):
        raise CheckpointError(f"{file} must hold a JSON object")
    return raw
