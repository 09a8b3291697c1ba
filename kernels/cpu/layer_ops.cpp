// The elementwise work of a decoder layer, each in one pass instead of PyTorch's several ops:
// the residual add with the RMSNorm after it, SiLU(gate) * up, and the rotary embedding of the
// queries and keys in place. A decode step of a few tokens spends more in the hand-offs between
// small ops than in their arithmetic. fp32 only (the PyTorch code in engine/ serves the rest).
// A few rows run on the calling thread; a prompt's many rows are shared among the threads.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>

#include "fast_exp.h"
#include "ops.h"

namespace pdserve_cpu {

constexpr int64_t kRowsPerTask = 16;  // fewer rows than this stay on the calling thread

// residual += x; returns rms_norm(residual) * weight, as transformers' LlamaRMSNorm in fp32.
at::Tensor add_rms_norm_(at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight,
                         double eps) {
  TORCH_CHECK(residual.dim() == 2 && residual.is_contiguous() && x.sizes() == residual.sizes() &&
                  x.stride(1) == 1 && weight.is_contiguous() && weight.numel() == x.size(1),
              "add_rms_norm_: residual and x [T, hidden] (residual contiguous), weight [hidden]");
  TORCH_CHECK(residual.scalar_type() == at::kFloat && x.scalar_type() == at::kFloat &&
                  weight.scalar_type() == at::kFloat,
              "add_rms_norm_: fp32 only");
  const int64_t rows = x.size(0), hidden = x.size(1);
  at::Tensor out = at::empty(residual.sizes(), residual.options());
  float* r = residual.mutable_data_ptr<float>();
  const float* xp = x.const_data_ptr<float>();
  const float* w = weight.const_data_ptr<float>();
  float* o = out.mutable_data_ptr<float>();
  at::parallel_for(0, rows, kRowsPerTask, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float* rt = r + t * hidden;
      const float* xt = xp + t * x.stride(0);
      float squares = 0.f;
#pragma omp simd reduction(+ : squares)
      for (int64_t i = 0; i < hidden; ++i) {
        rt[i] += xt[i];
        squares += rt[i] * rt[i];
      }
      const float inv = 1.f / std::sqrt(squares / static_cast<float>(hidden) +
                                        static_cast<float>(eps));
      float* ot = o + t * hidden;
#pragma omp simd
      for (int64_t i = 0; i < hidden; ++i) ot[i] = w[i] * (rt[i] * inv);
    }
  });
  return out;
}

// silu(gate) * up over gate_up [T, 2I] (gate first, as the loader stacks them): [T, I].
at::Tensor silu_and_mul(const at::Tensor& gate_up) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.size(1) % 2 == 0 && gate_up.stride(1) == 1,
              "silu_and_mul: gate_up [T, 2 * intermediate], last dim contiguous");
  TORCH_CHECK(gate_up.scalar_type() == at::kFloat, "silu_and_mul: fp32 only");
  const int64_t rows = gate_up.size(0), size = gate_up.size(1) / 2;
  at::Tensor out = at::empty({rows, size}, gate_up.options());
  const float* in = gate_up.const_data_ptr<float>();
  float* o = out.mutable_data_ptr<float>();
  at::parallel_for(0, rows, kRowsPerTask, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* gate = in + t * gate_up.stride(0);
      const float* up = gate + size;
      float* ot = o + t * size;
#pragma omp simd
      for (int64_t i = 0; i < size; ++i) ot[i] = gate[i] / (1.f + fast_exp(-gate[i])) * up[i];
    }
  });
  return out;
}

// Rotates heads [0, heads) of tokens [begin, end). The two products are rounded before their
// sum, as transformers rounds them: the build's fused multiply-adds are off in this function.
__attribute__((optimize("fp-contract=off"))) void rotate_rows(
    float* x, int64_t s_token, int64_t s_head, const float* cos, const float* sin, int64_t dim,
    int64_t heads, int64_t begin, int64_t end) {
  const int64_t half = dim / 2;
  for (int64_t t = begin; t < end; ++t) {
    const float* c = cos + t * dim;
    const float* s = sin + t * dim;
    for (int64_t h = 0; h < heads; ++h) {
      float* head = x + t * s_token + h * s_head;
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) {
        const float x1 = head[i], x2 = head[i + half];
        const float first = x1 * c[i], rotated_first = x2 * s[i];
        const float second = x2 * c[i + half], rotated_second = x1 * s[i + half];
        head[i] = first + rotated_first;
        head[i + half] = second + rotated_second;
      }
    }
  }
}

// Rotates the first `heads` heads of x [T, H, D] in place, non-interleaved halves as
// transformers' rotate_half: [x1, x2] -> [x1 cos - x2 sin, x2 cos + x1 sin], with cos [T, D]
// (each angle in both halves) and sin [T, D] (-sin in the first half, sin in the second).
void rope_(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, int64_t heads) {
  TORCH_CHECK(x.dim() == 3 && x.stride(2) == 1 && heads <= x.size(1),
              "rope_: x [T, H, D], last dim contiguous");
  TORCH_CHECK(cos.dim() == 2 && cos.is_contiguous() && sin.is_contiguous() &&
                  cos.sizes() == sin.sizes() && cos.size(0) == x.size(0) &&
                  cos.size(1) == x.size(2),
              "rope_: cos and sin [T, D], contiguous");
  TORCH_CHECK(x.scalar_type() == at::kFloat && cos.scalar_type() == at::kFloat &&
                  sin.scalar_type() == at::kFloat,
              "rope_: fp32 only");
  float* xp = x.mutable_data_ptr<float>();
  at::parallel_for(0, x.size(0), kRowsPerTask, [&](int64_t begin, int64_t end) {
    rotate_rows(xp, x.stride(0), x.stride(1), cos.const_data_ptr<float>(),
                sin.const_data_ptr<float>(), x.size(2), heads, begin, end);
  });
}

}  // namespace pdserve_cpu

TORCH_LIBRARY_FRAGMENT(pdserve, m) {
  m.def("add_rms_norm_(Tensor(a!) residual, Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("silu_and_mul(Tensor gate_up) -> Tensor");
  m.def("rope_(Tensor(a!) x, Tensor cos, Tensor sin, int heads) -> ()");
}

TORCH_LIBRARY_IMPL(pdserve, CPU, m) {
  m.impl("add_rms_norm_", &pdserve_cpu::add_rms_norm_);
  m.impl("silu_and_mul", &pdserve_cpu::silu_and_mul);
  m.impl("rope_", &pdserve_cpu::rope_);
}
