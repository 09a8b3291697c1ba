"""The engine's knobs as command-line flags, derived from ``EngineConfig`` itself.

Each field but ``model`` is a flag of the same name (``max_num_seqs`` is ``--max-num-seqs``, as
in vLLM), typed from the field's annotation (a ``dict`` takes JSON, as in vLLM), and lands under
the same key in a served model's ``engine:`` section: a new field is a new flag with nothing else
to keep in step. A flag left out is absent from the section, so the engine's own default applies.
"""

import argparse
import dataclasses
import json
import types
import typing
from typing import Any

from pdserve.engine.config import DTYPES, QUANTIZATIONS, EngineConfig

# Fields that are no flag: the checkpoint is the command's own argument.
NOT_FLAGS = frozenset({"model"})
# A field whose values are a fixed set its annotation does not spell (a plain ``str``).
CHOICES = {"dtype": DTYPES, "quantization": QUANTIZATIONS}
HELP = {
    "dtype": "weights and KV cache",
    "device": "cpu, or cuda (Triton attention)",
    "quantization": "int8: the linear layers' weights as llama.cpp's Q8_0 (a scale per 32), "
    "on the CPU in float32",
    "block_size": "tokens per KV block",
    "kv_cache_memory_bytes": "KV cache budget per replica; the block count is derived from it",
    "num_kv_blocks": "KV blocks per replica, overriding the budget (default: from the budget)",
    "max_model_len": "context limit, capped by the model's (default: the model's)",
    "max_num_seqs": "most requests running at once in a replica",
    "max_num_batched_tokens": "token budget of one step; longer prompts prefill in chunks",
    "long_prefill_token_threshold": "when > 0, the most tokens of one prompt prefilled a step",
    "enable_prefix_caching": "reuse KV blocks of earlier prompts with the same prefix",
    "scheduling_policy": "fcfs, or priority (lower priority runs first)",
    "max_waiting_requests": "waiting requests past this are refused (HTTP 503)",
    "seed": "the sampler's seed for requests without their own",
    "generation_config": "request defaults: auto (the model's generation_config.json), vllm "
    "(none), or a folder holding that file",
    "override_generation_config": "JSON entries over that file's, e.g. '{\"temperature\": 0.5}'",
}


def engine_fields(skip: frozenset[str] = frozenset()) -> list[dataclasses.Field]:
    """``EngineConfig``'s fields that are flags, less ``skip`` (names a command uses otherwise)."""
    return [f for f in dataclasses.fields(EngineConfig) if f.name not in NOT_FLAGS | skip]


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_engine_arguments(
    parser: argparse.ArgumentParser, skip: frozenset[str] = frozenset()
) -> None:
    """One flag per engine field, in a group of its own; each defaults to None (not given)."""
    group = parser.add_argument_group("engine", "EngineConfig's fields (the config's `engine:`)")
    hints = typing.get_type_hints(EngineConfig)
    for field in engine_fields(skip):
        kind = _unwrap_optional(hints[field.name])
        # A field whose default is None says in its help what None means.
        shown = "" if field.default is None else f" (default: {field.default})"
        options: dict[str, Any] = {"default": None, "help": HELP[field.name] + shown}
        if kind is bool:
            options["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(kind) is typing.Literal:
            options["choices"] = typing.get_args(kind)
        elif typing.get_origin(kind) is dict:
            options["type"] = json_object
        else:
            options["type"] = kind
            if field.name in CHOICES:
                options["choices"] = CHOICES[field.name]
        group.add_argument(flag(field.name), **options)


def engine_section(args: argparse.Namespace, skip: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The ``engine:`` section the flags given in ``args`` make (absent ones left out)."""
    given = {f.name: getattr(args, f.name) for f in engine_fields(skip)}
    return {name: value for name, value in given.items() if value is not None}


def json_object(text: str) -> dict[str, Any]:
    """A flag's JSON object; argparse reports the ValueError as an invalid value."""
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError(f"not a JSON object: {text}")
    return value


def _unwrap_optional(kind: Any) -> Any:
    """``int | None`` -> ``int``: None stands for "not given" already."""
    if isinstance(kind, types.UnionType):
        (inner,) = [arg for arg in typing.get_args(kind) if arg is not type(None)]
        return inner
    return kind
