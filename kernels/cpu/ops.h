// The native ops each file defines, for decode_layers.cpp to call directly (without the
// dispatcher) and for torch's registrations at the end of each file.

#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace pdserve_cpu {

at::Tensor decode_attention(const at::Tensor& query, const at::Tensor& kv_cache,
                            const at::Tensor& block_tables, const at::Tensor& seq_lens,
                            double scale);
void write_kv(const at::Tensor& key, const at::Tensor& value, at::Tensor& kv_cache,
              const at::Tensor& slot_mapping);
// Weights an int8 row's scale covers (llama.cpp's Q8_0 block).
constexpr int64_t kQ8Block = 32;

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight,
                  const c10::optional<at::Tensor>& scales, const c10::optional<at::Tensor>& bias);
at::Tensor add_rms_norm_(at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight,
                         double eps);
at::Tensor silu_and_mul(const at::Tensor& gate_up);
void rope_(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t heads);

}  // namespace pdserve_cpu
