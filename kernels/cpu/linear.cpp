// y = x W^T (+ b) for the few rows of a small decode step, over W in its checkpoint layout
// [out, in]: each thread streams whole rows of W, and the rows go out in chunks taken as threads
// free up, so a thread the OS preempts (2 cores shared with the server's other processes) holds
// up one chunk, not half of every product. Bandwidth-bound: each row of W is read once for all
// of x's rows. fp32 only; more rows and other dtypes go to oneDNN or MKL (engine/linear.py).

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <atomic>
#include <cstdint>
#include <cstring>

#include "ops.h"

namespace pdserve_cpu {

// x's rows a call takes, each one accumulator per row of W in a tile: past 4 rows oneDNN's packed
// product is as fast (docs/benchmarks.md, "Measurements behind the code's choices").
constexpr int64_t kMaxRows = 4;
constexpr int64_t kChunkRows = 256;  // W rows a thread takes at a time
constexpr int64_t kTileRows = 4;     // W rows multiplied together, their loads interleaved
constexpr int64_t kPrefetchFloats = 256;  // how far ahead in a row of W its lines are asked for

// 16 floats: one AVX-512 register, or two AVX2 ones, as the build's -march allows.
typedef float v16 __attribute__((vector_size(64)));
constexpr int64_t kLanes = 16;

inline v16 load(const float* p) {
  v16 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));

// The lanes summed as a tree of halves: a serial sum would cost more than a short row's products.
inline float lane_sum(v16 v) {
  v8 lo, hi;
  std::memcpy(&lo, &v, sizeof(lo));
  std::memcpy(&hi, reinterpret_cast<const char*>(&v) + sizeof(lo), sizeof(hi));
  const v8 eight = lo + hi;
  v4 lo4, hi4;
  std::memcpy(&lo4, &eight, sizeof(lo4));
  std::memcpy(&hi4, reinterpret_cast<const char*>(&eight) + sizeof(lo4), sizeof(hi4));
  const v4 four = lo4 + hi4;
  return (four[0] + four[2]) + (four[1] + four[3]);
}

// y[t, o + r] = x[t] . w[o + r] for r < R and t < T.
template <int64_t R, int64_t T>
inline void tile(const float* x, int64_t sx, const float* w, int64_t in, float* y, int64_t sy,
                 int64_t o) {
  v16 acc[R][T];
  for (int64_t r = 0; r < R; ++r)
    for (int64_t t = 0; t < T; ++t) acc[r][t] = v16{};
  int64_t i = 0;
  for (; i + kLanes <= in; i += kLanes) {
    v16 xv[T];
    for (int64_t t = 0; t < T; ++t) xv[t] = load(x + t * sx + i);
    for (int64_t r = 0; r < R; ++r) {
      __builtin_prefetch(w + (o + r) * in + i + kPrefetchFloats);
      const v16 wv = load(w + (o + r) * in + i);
      for (int64_t t = 0; t < T; ++t) acc[r][t] += wv * xv[t];
    }
  }
  for (int64_t r = 0; r < R; ++r)
    for (int64_t t = 0; t < T; ++t) {
      float s = lane_sum(acc[r][t]);
      for (int64_t j = i; j < in; ++j) s += w[(o + r) * in + j] * x[t * sx + j];
      y[t * sy + o + r] = s;
    }
}

template <int64_t T>
void rows(const float* x, int64_t sx, const float* w, int64_t in, float* y, int64_t sy,
          int64_t begin, int64_t end) {
  int64_t o = begin;
  for (; o + kTileRows <= end; o += kTileRows) tile<kTileRows, T>(x, sx, w, in, y, sy, o);
  for (; o < end; ++o) tile<1, T>(x, sx, w, in, y, sy, o);
}

at::Tensor small_linear(const at::Tensor& x, const at::Tensor& weight,
                        const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && x.size(0) <= kMaxRows && x.stride(1) == 1,
              "x: [rows <= ", kMaxRows, ", in], last dim contiguous");
  TORCH_CHECK(weight.dim() == 2 && weight.is_contiguous() && weight.size(1) == x.size(1),
              "weight: contiguous [out, in]");
  TORCH_CHECK(x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat, "fp32 only");
  const int64_t num_rows = x.size(0), in = x.size(1), out = weight.size(0);
  at::Tensor y = at::empty({num_rows, out}, x.options());
  if (num_rows == 0) return y;  // e.g. a step of prompt chunks none of which samples
  const float* xp = x.const_data_ptr<float>();
  const float* wp = weight.const_data_ptr<float>();
  float* yp = y.mutable_data_ptr<float>();
  const int64_t sx = x.stride(0);
  const int64_t chunks = (out + kChunkRows - 1) / kChunkRows;
  std::atomic<int64_t> next{0};
  auto work = [&](int64_t, int64_t) {
    for (int64_t chunk = next++; chunk < chunks; chunk = next++) {
      const int64_t begin = chunk * kChunkRows, end = std::min(out, begin + kChunkRows);
      switch (num_rows) {
        case 1: rows<1>(xp, sx, wp, in, yp, out, begin, end); break;
        case 2: rows<2>(xp, sx, wp, in, yp, out, begin, end); break;
        case 3: rows<3>(xp, sx, wp, in, yp, out, begin, end); break;
        default: rows<4>(xp, sx, wp, in, yp, out, begin, end); break;
      }
    }
  };
  at::parallel_for(0, std::min<int64_t>(at::get_num_threads(), chunks), 1, work);
  if (bias.has_value()) y.add_(*bias);
  return y;
}

}  // namespace pdserve_cpu

TORCH_LIBRARY_FRAGMENT(pdserve, m) {
  m.def("small_linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(pdserve, CPU, m) { m.impl("small_linear", &pdserve_cpu::small_linear); }
