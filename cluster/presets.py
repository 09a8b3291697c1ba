"""Sizes of the built-in Llama models that ``pdserve make-model`` writes."""

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelPreset:
    name: str
    vocab_size: int  # the BPE tokenizer is trained to exactly this many ids
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    tie_word_embeddings: bool

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"preset {self.name}: num_attention_heads ({self.num_attention_heads}) must be a "
                f"multiple of num_key_value_heads ({self.num_key_value_heads})"
            )

    @property
    def num_parameters(self) -> int:
        h, hd = self.hidden_size, self.head_dim
        attn = h * hd * (2 * self.num_attention_heads + 2 * self.num_key_value_heads)  # q, o, k, v
        mlp = 3 * h * self.intermediate_size  # gate, up, down
        layer = attn + mlp + 2 * h  # + two RMSNorms
        embeddings = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_hidden_layers * layer + embeddings + h  # + final norm


PRESETS: dict[str, ModelPreset] = {
    # Fast enough for unit tests on a laptop CPU; tied like Qwen2-0.5B, so a tied head is exercised.
    "tiny": ModelPreset(
        name="tiny",
        vocab_size=4096,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    ),
    # GPT-2-small scale (~125M) with Llama's untied head, for benchmarks that need real matmul work.
    "small": ModelPreset(
        name="small",
        vocab_size=32000,
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=4,
        head_dim=64,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    ),
}
