"""Typed, frozen configuration: the model (read from an HF ``config.json`` or a GGUF file's
metadata) and the engine knobs."""

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pdserve.engine.checkpoint_format import HF_CONFIG_FILE, gguf_file

if TYPE_CHECKING:  # the router reads these configs and imports no torch
    import torch

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral")
SUPPORTED_ROPE_SCALING = ("default", "linear", "llama3")
DTYPES = ("float32", "bfloat16", "float16")  # names of torch dtypes
QUANTIZATIONS = ("int8",)  # weight-only, of the linear layers (engine/quantization.py)
DEFAULT_KV_CACHE_MEMORY_BYTES = 1 << 30
DEFAULT_BLOCK_SIZE = 16
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
DEFAULT_MAX_WAITING_REQUESTS = 1024
SCHEDULING_POLICIES = ("fcfs", "priority")
# Where requests' sampling defaults come from (vLLM's --generation-config), besides a folder holding
# a generation_config.json: the checkpoint's own file, or none (SamplingParams' neutral defaults).
GENERATION_CONFIG_AUTO, GENERATION_CONFIG_NONE = "auto", "vllm"
GENERATION_CONFIG_NAMES = (GENERATION_CONFIG_AUTO, GENERATION_CONFIG_NONE)  # others are folders


@dataclass(frozen=True)
class RopeScaling:
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class ModelConfig:
    """The architecture of one Llama-family checkpoint (llama, qwen2, mistral)."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling
    tie_word_embeddings: bool
    attention_bias: bool
    # Attention is always full, so a model with an active sliding window is served up to the window.
    sliding_window: int | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)

    @property
    def num_parameters(self) -> int:
        """The weights a checkpoint of this architecture holds (norms and q/k/v biases too)."""
        h, hd = self.hidden_size, self.head_dim
        qkv_rows = (self.num_attention_heads + 2 * self.num_key_value_heads) * hd
        attention = h * qkv_rows + self.num_attention_heads * hd * h  # q, k, v and o
        bias = qkv_rows if self.attention_bias else 0
        layer = attention + bias + 3 * h * self.intermediate_size + 2 * h  # MLP, two RMSNorms
        embeddings = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_hidden_layers * layer + embeddings + h  # + the final norm

    @property
    def max_model_len(self) -> int:
        if self.sliding_window is None:
            return self.max_position_embeddings
        return min(self.max_position_embeddings, self.sliding_window)

    @classmethod
    def from_pretrained(cls, path: str | Path) -> "ModelConfig":
        """From an HF checkpoint folder's ``config.json``, or a GGUF checkpoint's metadata."""
        gguf = gguf_file(path)
        if gguf is not None:
            # Imported here: only a GGUF checkpoint needs the gguf package.
            from pdserve.engine.gguf_checkpoint import gguf_model_config

            return gguf_model_config(gguf)
        config_path = Path(path) / HF_CONFIG_FILE
        if not config_path.is_file():
            raise FileNotFoundError(f"model config not found: {config_path}")
        return cls.from_dict(json.loads(config_path.read_text()))

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "ModelConfig":
        model_type = raw.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"unsupported model_type {model_type!r}; "
                f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        num_heads = raw["num_attention_heads"]
        num_kv_heads = raw.get("num_key_value_heads") or num_heads
        if num_heads % num_kv_heads:
            raise ValueError(
                f"num_attention_heads ({num_heads}) must be a multiple of "
                f"num_key_value_heads ({num_kv_heads})"
            )
        # qwen2 always has q/k/v bias and no flag for it; llama/mistral say so with attention_bias.
        attention_bias = model_type == "qwen2" or bool(raw.get("attention_bias", False))
        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        return cls(
            model_type=model_type,
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_hidden_layers=raw["num_hidden_layers"],
            num_attention_heads=num_heads,
            num_key_value_heads=num_kv_heads,
            head_dim=raw.get("head_dim") or raw["hidden_size"] // num_heads,
            max_position_embeddings=raw.get("max_position_embeddings", 2048),
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=_rope_theta(raw),
            rope_scaling=_rope_scaling(raw),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=attention_bias,
            sliding_window=_sliding_window(raw),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )


def _sliding_window(raw: dict[str, Any]) -> int | None:
    # qwen2 carries a window but only uses it with use_sliding_window; mistral uses it when set.
    if raw["model_type"] == "qwen2" and not raw.get("use_sliding_window", False):
        return None
    return raw.get("sliding_window")


def _rope_theta(raw: dict[str, Any]) -> float:
    # transformers 5 moved rope_theta into rope_parameters; accept both spellings.
    params = raw.get("rope_parameters") or {}
    return float(raw.get("rope_theta", params.get("rope_theta", 10000.0)))


def _rope_scaling(raw: dict[str, Any]) -> RopeScaling:
    scaling = raw.get("rope_scaling") or raw.get("rope_parameters") or {}
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_SCALING:
        raise ValueError(
            f"unsupported rope_scaling type {rope_type!r}; "
            f"supported: {', '.join(SUPPORTED_ROPE_SCALING)}"
        )
    defaults = RopeScaling()
    return RopeScaling(
        rope_type=rope_type,
        factor=float(scaling.get("factor", defaults.factor)),
        low_freq_factor=float(scaling.get("low_freq_factor", defaults.low_freq_factor)),
        high_freq_factor=float(scaling.get("high_freq_factor", defaults.high_freq_factor)),
        original_max_position_embeddings=int(
            scaling.get(
                "original_max_position_embeddings", defaults.original_max_position_embeddings
            )
        ),
    )


@dataclass(frozen=True)
class EngineConfig:
    """Engine knobs; names match vLLM's engine args where one exists."""

    model: str
    dtype: str = "float32"
    device: str = "cpu"
    quantization: str | None = None  # one of QUANTIZATIONS; None: the weights as dtype
    block_size: int = DEFAULT_BLOCK_SIZE
    kv_cache_memory_bytes: int = DEFAULT_KV_CACHE_MEMORY_BYTES
    num_kv_blocks: int | None = None  # overrides kv_cache_memory_bytes when set
    max_model_len: int | None = None  # defaults to the model's max_position_embeddings
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    long_prefill_token_threshold: int = 0  # > 0: cap on one prompt's chunk per step
    enable_prefix_caching: bool = True
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    # Back-pressure of the async engine: past this many waiting requests, new ones are refused.
    max_waiting_requests: int = DEFAULT_MAX_WAITING_REQUESTS
    seed: int = 0
    # Requests' sampling defaults (engine/generation_config.py): "auto", "vllm" or a folder.
    generation_config: str = GENERATION_CONFIG_AUTO
    override_generation_config: dict[str, Any] | None = None  # entries over the file's

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.quantization is not None:
            if self.quantization not in QUANTIZATIONS:
                raise ValueError(
                    f"quantization must be one of {', '.join(QUANTIZATIONS)}, "
                    f"got {self.quantization!r}"
                )
            if self.device != "cpu" or self.dtype != "float32":
                raise ValueError(
                    f"quantization {self.quantization} runs on the CPU in float32, "
                    f"got device {self.device!r}, dtype {self.dtype!r}"
                )
        for name in (
            "block_size",
            "kv_cache_memory_bytes",
            "max_num_seqs",
            "max_num_batched_tokens",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.num_kv_blocks is not None and self.num_kv_blocks <= 0:
            raise ValueError(f"num_kv_blocks must be > 0, got {self.num_kv_blocks}")
        if self.long_prefill_token_threshold < 0:
            raise ValueError(
                "long_prefill_token_threshold must be >= 0, "
                f"got {self.long_prefill_token_threshold}"
            )
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(
                f"scheduling_policy must be one of {', '.join(SCHEDULING_POLICIES)}, "
                f"got {self.scheduling_policy!r}"
            )
        if not self.generation_config:
            raise ValueError('generation_config must be "auto", "vllm" or a folder, got ""')
        if not isinstance(self.override_generation_config, dict | None):
            raise ValueError(
                "override_generation_config must be a mapping, "
                f"got {self.override_generation_config!r}"
            )

    @property
    def torch_dtype(self) -> "torch.dtype":
        import torch

        return getattr(torch, self.dtype)

    def effective_max_model_len(self, model: ModelConfig) -> int:
        """The context the engine serves: ``max_model_len`` capped by what the model supports."""
        return min(self.max_model_len or model.max_model_len, model.max_model_len)
