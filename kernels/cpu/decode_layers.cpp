// Every decoder layer of a step of decodes in one call: engine/model.py's DecoderLayer
// loop, op for op (the same native ops in the same order, so the same bits), without Python
// between them. A batch-1 step of SmolLM2 is ~300 ops; from Python each one takes the GIL to
// start and to return, which in a server waits behind the thread streaming tokens, and costs
// the interpreter's own time besides.

#include <ATen/core/Tensor.h>
#include <ATen/ops/rms_norm.h>
#include <torch/library.h>

#include <tuple>

#include "ops.h"

namespace pdserve_cpu {

// Per layer, in `weights`: input_layernorm, qkv_proj, o_proj, post_attention_layernorm,
// gate_up_proj, down_proj; `scales`: none (fp32 products) or per layer the int8 products' scales
// (qkv_proj, o_proj, gate_up_proj, down_proj); `qkv_biases` holds one per layer or none. Returns
// (the last layer's output, the residual stream before it), as DecoderLayer.forward does.
std::tuple<at::Tensor, at::Tensor> decode_layers(
    const at::Tensor& x, at::TensorList weights, at::TensorList scales, at::TensorList qkv_biases,
    const at::Tensor& kv_cache, const at::Tensor& slot_mapping, const at::Tensor& block_tables,
    const at::Tensor& seq_lens, const at::Tensor& cos, const at::Tensor& sin, int64_t num_heads,
    int64_t num_kv_heads, double eps, double scale) {
  constexpr int64_t per_layer = 6, scales_per_layer = 4;
  const int64_t layers = kv_cache.size(1), tokens = x.size(0), dim = kv_cache.size(5);
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == per_layer * layers,
              "decode_layers: 6 weights per layer");
  TORCH_CHECK(scales.empty() || static_cast<int64_t>(scales.size()) == scales_per_layer * layers,
              "decode_layers: 4 scales per layer, or none");
  TORCH_CHECK(qkv_biases.empty() || static_cast<int64_t>(qkv_biases.size()) == layers,
              "decode_layers: one qkv bias per layer, or none");
  const int64_t hidden = x.size(1);
  at::Tensor out = x, residual;
  for (int64_t i = 0; i < layers; ++i) {
    const at::Tensor* w = &weights[per_layer * i];
    // The scales of the layer's products, in their order, or none.
    auto scales_of = [&](int64_t product) {
      return scales.empty() ? c10::nullopt
                            : c10::optional<at::Tensor>(scales[scales_per_layer * i + product]);
    };
    at::Tensor h;
    if (i == 0) {
      residual = x.clone();  // the stream is added to in place; the caller's x stays as it was
      h = at::rms_norm(x, {hidden}, w[0], eps);
    } else {
      h = add_rms_norm_(residual, out, w[0], eps);
    }
    const c10::optional<at::Tensor> bias =
        qkv_biases.empty() ? c10::nullopt : c10::optional<at::Tensor>(qkv_biases[i]);
    at::Tensor heads = linear(h, w[1], scales_of(0), bias).view({tokens, -1, dim});
    rope_(heads, cos, sin, num_heads + num_kv_heads);
    at::Tensor cache = kv_cache.select(1, i);
    write_kv(heads.narrow(1, num_heads, num_kv_heads),
             heads.narrow(1, num_heads + num_kv_heads, num_kv_heads), cache, slot_mapping);
    at::Tensor attended = decode_attention(heads.narrow(1, 0, num_heads), cache, block_tables,
                                           seq_lens, scale);
    out = linear(attended.view({tokens, num_heads * dim}), w[2], scales_of(1), c10::nullopt);
    h = add_rms_norm_(residual, out, w[3], eps);
    out = linear(silu_and_mul(linear(h, w[4], scales_of(2), c10::nullopt)), w[5], scales_of(3),
                 c10::nullopt);
  }
  return {out, residual};
}

}  // namespace pdserve_cpu

TORCH_LIBRARY_FRAGMENT(pdserve, m) {
  m.def(
      "decode_layers(Tensor x, Tensor[] weights, Tensor[] scales, Tensor[] qkv_biases, "
      "Tensor(a!) kv_cache, Tensor slot_mapping, Tensor block_tables, Tensor seq_lens, "
      "Tensor cos, Tensor sin, "
      "int num_heads, int num_kv_heads, float eps, float scale) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(pdserve, CPU, m) { m.impl("decode_layers", &pdserve_cpu::decode_layers); }
