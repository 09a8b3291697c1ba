"""The Llama-family decoder (llama, qwen2, mistral) over a paged KV cache.

q/k/v and gate/up projections are fused into one matmul each (the loader stacks HF's separate
weights), which saves a kernel launch per projection in every decode step.
"""

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from pdserve.engine.attention import AttentionMetadata, paged_attention
from pdserve.engine.config import ModelConfig
from pdserve.engine.linear import Linear
from pdserve.engine.rope import RopeTables, RotaryEmbedding
from pdserve.kernels import native


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 and cast back before the weight, exactly as transformers does. In fp32
        # torch's fused rms_norm rounds the same (bitwise equal on the presets' shapes) in one op
        # instead of six, which is faster (docs/benchmarks.md, "Measurements behind the code's
        # choices").
        if x.dtype == torch.float32:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)

    def add_and_norm(
        self, x: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(residual + x), residual + x): the next block's input and the residual stream's
        sum, in one native op where it serves (which updates ``residual`` in place)."""
        if native.serves(x) and residual.is_contiguous():
            return native.add_rms_norm_(residual, x, self.weight, self.eps), residual
        residual = residual + x
        return self(residual), residual


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scale = self.head_dim**-0.5
        self.qkv_proj = Linear(
            config.hidden_size, self.q_size + 2 * self.kv_size, bias=config.attention_bias
        )
        self.o_proj = Linear(self.q_size, config.hidden_size, bias=False)

    def forward(
        self,
        rope: RopeTables,
        x: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        # x: [T, hidden]
        heads = self.qkv_proj(x).view(x.shape[0], -1, self.head_dim)  # [T, Hq + 2 Hkv, D]
        # Queries and keys sit side by side in the fused output: one rotation covers both.
        qk = rope.rotate(heads, self.num_heads + self.num_kv_heads)
        q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
        v = heads[:, self.num_heads + self.num_kv_heads :]
        out = paged_attention(q, k, v, kv_cache, meta, self.scale)  # [T, Hq, D]
        return self.o_proj(out.reshape(-1, self.q_size))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if native.serves(gate_up):
            return self.down_proj(native.silu_and_mul(gate_up))
        gate, up = gate_up.chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        rope: RopeTables,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x: the previous layer's output, added to the residual stream here (the first layer's
        x is the embedding, and its residual None). Returns (this layer's output, the residual
        stream before it), as vLLM's layers do, so each add is fused with the norm after it."""
        if residual is None:
            x, residual = self.input_layernorm(x), x
        else:
            x, residual = self.input_layernorm.add_and_norm(x, residual)
        x = self.self_attn(rope, x, kv_cache, meta)
        x, residual = self.post_attention_layernorm.add_and_norm(x, residual)
        return self.mlp(x), residual


@dataclass(frozen=True)
class DecodeWeights:
    """``native.decode_layers``' weights: per layer input_layernorm, qkv_proj, o_proj,
    post_attention_layernorm, gate_up_proj, down_proj; the int8 products' scales (none for fp32
    weights); the qkv biases, if any. ``mixed``: some products int8 and some not (rows that do
    not split into Q8_0 blocks), which the native op does not take."""

    weights: list[torch.Tensor]
    scales: list[torch.Tensor]
    biases: list[torch.Tensor]
    mixed: bool

    def arguments(self) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
        return self.weights, self.scales, self.biases


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.rope = RotaryEmbedding(config, dtype, device)
        # Given an uninitialised weight, as every module here: nn.Embedding's own random init is
        # wasted on values the checkpoint replaces.
        weight = torch.empty(config.vocab_size, config.hidden_size)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, _weight=weight)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.config = config
        self._decode_weights: DecodeWeights | None = None

    def _native_decode(self, x: torch.Tensor, meta: AttentionMetadata) -> bool:
        """Whether the native op runs the layers: a step of decodes only, in fp32 on the CPU, of
        a few sequences (or over int8 weights, fewer than their products dequantize from:
        ``Linear.dequantize_from_rows``). It runs the same native ops as the layers' Python would,
        in one call (no GIL hand-offs between ops, no interpreter time)."""
        if meta.num_decodes != meta.num_seqs or not native.serves(x):
            return False
        weights = self._layer_weights()
        if weights.mixed:
            return False
        if weights.scales:
            many = self.layers[0].self_attn.qkv_proj.dequantize_from_rows
            return many is None or x.shape[0] < many
        return x.shape[0] <= native.NATIVE_DECODE_MAX_ROWS

    def _layer_weights(self) -> DecodeWeights:
        """The layers' weights for ``native.decode_layers``, gathered once (the loader copies
        into the parameters, and quantizes, before the first step)."""
        if self._decode_weights is None:
            weights: list[torch.Tensor] = []
            scales: list[torch.Tensor] = []
            biases: list[torch.Tensor] = []
            quantized = []
            for layer in self.layers:
                attention, mlp = layer.self_attn, layer.mlp
                products = [attention.qkv_proj, attention.o_proj, mlp.gate_up_proj, mlp.down_proj]
                weights += [
                    layer.input_layernorm.weight,
                    attention.qkv_proj.weight,
                    attention.o_proj.weight,
                    layer.post_attention_layernorm.weight,
                    mlp.gate_up_proj.weight,
                    mlp.down_proj.weight,
                ]
                quantized += [p.quantized for p in products]
                scales += [p.scales for p in products if p.scales is not None]
                if attention.qkv_proj.bias is not None:
                    biases.append(attention.qkv_proj.bias)
            mixed = any(quantized) and not all(quantized)
            self._decode_weights = DecodeWeights(weights, scales, biases, mixed)
        return self._decode_weights

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        logits_indices: torch.Tensor | None,
    ) -> torch.Tensor:
        # input_ids, positions: [T]; kv_cache: [num_blocks, num_layers, 2, block, Hkv, D]
        x, residual = self.embed_tokens(input_ids), None
        rope = self.rope.lookup(positions)
        if self._native_decode(x, meta):
            x, residual = native.decode_layers(
                x,
                *self._layer_weights().arguments(),
                kv_cache,
                (meta.slot_mapping, meta.block_tables, meta.seq_lens),
                (rope.cos, rope.sin),
                (self.config.num_attention_heads, self.config.num_key_value_heads),
                self.config.rms_norm_eps,
                self.config.head_dim**-0.5,
            )
        else:
            for i, layer in enumerate(self.layers):
                x, residual = layer(rope, x, residual, kv_cache[:, i], meta)
        if logits_indices is not None:  # the final norm is per token: only sampled ones need it
            x, residual = x[logits_indices], residual[logits_indices]
        return self.norm.add_and_norm(x, residual)[0]  # [len(logits_indices) or T, hidden]


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config, dtype, device)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def pack_linear_weights(self) -> None:
        """Copies every fp32 linear's weight into oneDNN's layout (see ``Linear.pack``)."""
        for module in self.modules():
            if isinstance(module, Linear) and not module.quantized:
                module.pack()

    def fp32_linear_weights(self) -> list[torch.Tensor]:
        """Every fp32 linear's weight [out, in], as the native few-row products read it."""
        return [
            module.weight
            for module in self.modules()
            if isinstance(module, Linear)
            and not module.quantized
            and module.weight.dtype == torch.float32
        ]

    def quantize_linear_weights(self) -> list[str]:
        """Every linear's weight (the LM head's too) as int8 Q8_0 blocks (``Linear.quantize``);
        the names of those whose rows do not split into blocks, left as they were."""
        return [
            name
            for name, module in self.named_modules()
            if isinstance(module, Linear) and not module.quantize()
        ]

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        logits_indices: torch.Tensor | None,
    ) -> torch.Tensor:
        """Runs one flattened step; returns fp32 logits [len(logits_indices), vocab], or for
        every token when ``logits_indices`` is None."""
        hidden = self.model(input_ids, positions, kv_cache, meta, logits_indices)
        return self.lm_head(hidden).float()
