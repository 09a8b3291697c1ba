// y = x W^T (+ b) over W in its checkpoint layout [out, in], held in fp32 or as int8 with a scale
// for each 32 weights of a row (llama.cpp's Q8_0 blocks, engine/quantization.py). W's rows go out
// in chunks taken as threads free up, so a thread the OS preempts (2 cores shared with the
// server's other processes) holds up one chunk, not half of every product. A chunk multiplies
// x's rows 4 or 8 at a time while its rows of W stay in cache: W is read from memory once per
// call. A few rows (a decode step) are bound by that read; many (a prompt) by the arithmetic,
// where oneDNN is faster over fp32 weights (engine/linear.py chooses). Rows of W are read several
// side by side, each of x's loads shared by them, a line ahead asked for; for one group of x's
// rows over fp32 weights the process may instead read W's rows one after another, front to back,
// one stream the hardware's prefetcher follows: faster on AMD's Zen 4, slower on Intel's Sapphire
// Rapids, so kernels/native.py times both on the model's weights and sets the faster
// (set_f32_rows_alone). Either way a sum runs in one order, so a row of y has the same bits
// whatever else is in the batch, and whichever way W is read.

#include <immintrin.h>

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <atomic>
#include <cstdint>
#include <cstring>

#include "ops.h"

namespace pdserve_cpu {

// W rows a thread takes at a time, for one group of x rows: small enough that a 768-row product
// splits evenly over 2 threads (256 left one thread a third of its rows more).
constexpr int64_t kFewChunk = 64;
constexpr int64_t kManyChunk = 64;  // ... for several groups: the chunk stays in L2 between them
// How far ahead in W its lines are asked for, by weight type: int8 rows are short, and at 1024
// bytes a 1-row product of SmolLM2's int8 weights took 1.3-1.5x as long (a standalone loop test).
constexpr int64_t kF32PrefetchBytes = 1024;
constexpr int64_t kQ8PrefetchBytes = 4096;

// A vector of floats as wide as the build's -march allows: 16 (one AVX-512 register) or 8 (one
// AVX2 register; 16 there would be two, and the tiles below would spill their accumulators).
#if defined(__AVX512F__)
constexpr int64_t kLanes = 16;
#else
constexpr int64_t kLanes = 8;
#endif
typedef float vec __attribute__((vector_size(kLanes * sizeof(float))));
typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));

inline vec load(const float* p) {
  vec v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// kLanes int8 values as floats. By intrinsics: GCC 12 converts a vector of int8 one lane at a time.
inline vec int8_to_float(const int8_t* q) {
  vec v;
#if defined(__AVX512F__)
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
  const __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes));
  std::memcpy(&v, &f, sizeof(v));
#elif defined(__AVX2__)
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q));
  const __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
  std::memcpy(&v, &f, sizeof(v));
#else
  for (int64_t i = 0; i < kLanes; ++i) v[i] = q[i];
#endif
  return v;
}

// The lanes summed as a tree of halves: a serial sum would cost more than a short row's products.
inline float lane_sum(vec v) {
  v8 eight;
  if constexpr (kLanes == 16) {
    v8 lo, hi;
    std::memcpy(&lo, &v, sizeof(lo));
    std::memcpy(&hi, reinterpret_cast<const char*>(&v) + sizeof(lo), sizeof(hi));
    eight = lo + hi;
  } else {
    std::memcpy(&eight, &v, sizeof(eight));
  }
  v4 lo4, hi4;
  std::memcpy(&lo4, &eight, sizeof(lo4));
  std::memcpy(&hi4, reinterpret_cast<const char*>(&eight) + sizeof(lo4), sizeof(hi4));
  const v4 four = lo4 + hi4;
  return (four[0] + four[2]) + (four[1] + four[3]);
}

// Whether one group of x's rows reads fp32 W a row at a time (set_f32_rows_alone).
std::atomic<bool> f32_rows_alone{true};

// W's rows in fp32.
struct F32Weights {
  // x's rows multiplied together, one accumulator each per row of W: beside more, their loads
  // outweigh the multiply-adds.
  static constexpr int64_t kGroupRows = 4;
  // When memory bound (one group of x's rows): W a row at a time, if this CPU reads it faster so.
  static bool reads_alone() { return f32_rows_alone.load(std::memory_order_relaxed); }
  const float* w;
  int64_t in;
  vec load_lanes(int64_t o, int64_t i) const { return load(w + o * in + i); }
  float at(int64_t o, int64_t i) const { return w[o * in + i]; }
  // A load is a cache line (AVX-512) or half of one: each asks for a line further on.
  void prefetch(int64_t o, int64_t i) const {
    const char* line = reinterpret_cast<const char*>(w + o * in + i);
    __builtin_prefetch(line + kF32PrefetchBytes);
  }
};

// W's rows as int8 with one scale per kQ8Block weights: 16 weights load as the exact floats
// scale * q (a scale is a float16's value, 11 bits, times 8 bits of q: exact in fp32), so the
// product is fp32's over the dequantized weight, read in under a third of the bytes.
struct Q8Weights {
  // Each 16 weights' conversion is shared by 8 of x's rows (at 4, 8-16 rows took twice as long).
  static constexpr int64_t kGroupRows = 8;
  static bool reads_alone() { return false; }  // an int8 row alone took twice as long
  const int8_t* q;
  const float* scales;
  int64_t in;
  vec load_lanes(int64_t o, int64_t i) const {
    return int8_to_float(q + o * in + i) * scales[o * (in / kQ8Block) + i / kQ8Block];
  }
  float at(int64_t o, int64_t i) const {
    return static_cast<float>(q[o * in + i]) * scales[o * (in / kQ8Block) + i / kQ8Block];
  }
  // 16 int8 are a quarter line: every fourth load asks for a line further on.
  void prefetch(int64_t o, int64_t i) const {
    if (i % 64 == 0) __builtin_prefetch(q + o * in + i + kQ8PrefetchBytes);
  }
};

// y[t, o + r] = x[t] . w[o + r] for r < R and t < T; ``ahead``: ask for W's lines ahead.
template <int64_t R, int64_t T, bool ahead = true, typename W>
inline void tile(const float* x, int64_t sx, const W& w, int64_t in, float* y, int64_t sy,
                 int64_t o) {
  vec acc[R][T];
  for (int64_t r = 0; r < R; ++r)
    for (int64_t t = 0; t < T; ++t) acc[r][t] = vec{};
  int64_t i = 0;
  for (; i + kLanes <= in; i += kLanes) {
    vec xv[T];
    for (int64_t t = 0; t < T; ++t) xv[t] = load(x + t * sx + i);
    for (int64_t r = 0; r < R; ++r) {
      if constexpr (ahead) w.prefetch(o + r, i);
      const vec wv = w.load_lanes(o + r, i);
      for (int64_t t = 0; t < T; ++t) acc[r][t] += wv * xv[t];
    }
  }
  for (int64_t r = 0; r < R; ++r)
    for (int64_t t = 0; t < T; ++t) {
      float s = lane_sum(acc[r][t]);
      for (int64_t j = i; j < in; ++j) s += w.at(o + r, j) * x[t * sx + j];
      y[t * sy + o + r] = s;
    }
}

// W rows multiplied together: one (``alone``), or their loads interleaved, as many as keep the
// accumulators within half the registers (16 of AVX-512's 32, 8 of AVX2's 16), 4 at most.
template <int64_t T, typename W>
void rows(const float* x, int64_t sx, const W& w, int64_t in, float* y, int64_t sy,
          int64_t begin, int64_t end, bool alone) {
  if (alone) {
    for (int64_t o = begin; o < end; ++o) tile<1, T, false>(x, sx, w, in, y, sy, o);
    return;
  }
#if defined(__AVX512F__)
  constexpr int64_t R = T <= 4 ? 4 : 2;
#else
  constexpr int64_t R = T <= 2 ? 4 : T <= 4 ? 2 : 1;
#endif
  int64_t o = begin;
  for (; o + R <= end; o += R) tile<R, T>(x, sx, w, in, y, sy, o);
  for (; o < end; ++o) tile<1, T>(x, sx, w, in, y, sy, o);
}

// x's rows [0, num_rows) times W's rows [begin, end), W::kGroupRows of x's rows at a time.
template <typename W>
void chunk_product(const float* x, int64_t sx, int64_t num_rows, const W& w, int64_t in,
                   int64_t out, float* y, int64_t begin, int64_t end) {
  const bool alone = num_rows <= W::kGroupRows && W::reads_alone();
  for (int64_t t = 0; t < num_rows; t += W::kGroupRows) {
    const float* xt = x + t * sx;
    float* yt = y + t * out;
    switch (std::min(W::kGroupRows, num_rows - t)) {
      case 1: rows<1>(xt, sx, w, in, yt, out, begin, end, alone); break;
      case 2: rows<2>(xt, sx, w, in, yt, out, begin, end, alone); break;
      case 3: rows<3>(xt, sx, w, in, yt, out, begin, end, alone); break;
      case 4: rows<4>(xt, sx, w, in, yt, out, begin, end, alone); break;
      case 5: rows<5>(xt, sx, w, in, yt, out, begin, end, alone); break;
      case 6: rows<6>(xt, sx, w, in, yt, out, begin, end, alone); break;
      case 7: rows<7>(xt, sx, w, in, yt, out, begin, end, alone); break;
      default: rows<8>(xt, sx, w, in, yt, out, begin, end, alone); break;
    }
  }
}

template <typename W>
void product(const float* x, int64_t sx, int64_t num_rows, const W& w, int64_t in, int64_t out,
             float* y) {
  const int64_t chunk_rows = num_rows <= W::kGroupRows ? kFewChunk : kManyChunk;
  const int64_t chunks = (out + chunk_rows - 1) / chunk_rows;
  std::atomic<int64_t> next{0};
  auto work = [&](int64_t, int64_t) {
    for (int64_t chunk = next++; chunk < chunks; chunk = next++) {
      const int64_t begin = chunk * chunk_rows, end = std::min(out, begin + chunk_rows);
      chunk_product(x, sx, num_rows, w, in, out, y, begin, end);
    }
  };
  at::parallel_for(0, std::min<int64_t>(at::get_num_threads(), chunks), 1, work);
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight,
                  const c10::optional<at::Tensor>& scales, const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && x.scalar_type() == at::kFloat,
              "linear: x fp32 [rows, in], last dim contiguous");
  TORCH_CHECK(weight.dim() == 2 && weight.is_contiguous() && weight.size(1) == x.size(1),
              "linear: weight contiguous [out, in]");
  const int64_t num_rows = x.size(0), in = x.size(1), out = weight.size(0);
  at::Tensor y = at::empty({num_rows, out}, x.options());
  if (num_rows == 0) return y;  // e.g. a step of prompt chunks none of which samples
  const float* xp = x.const_data_ptr<float>();
  float* yp = y.mutable_data_ptr<float>();
  if (scales.has_value()) {
    TORCH_CHECK(weight.scalar_type() == at::kChar && in % kQ8Block == 0,
                "linear: int8 weights need rows of a multiple of ", kQ8Block);
    TORCH_CHECK(scales->is_contiguous() && scales->scalar_type() == at::kFloat &&
                    scales->numel() == out * in / kQ8Block,
                "linear: scales fp32 [out, in / ", kQ8Block, "]");
    const Q8Weights w{weight.const_data_ptr<int8_t>(), scales->const_data_ptr<float>(), in};
    product(xp, x.stride(0), num_rows, w, in, out, yp);
  } else {
    TORCH_CHECK(weight.scalar_type() == at::kFloat, "linear: fp32 weights, or int8 with scales");
    const F32Weights w{weight.const_data_ptr<float>(), in};
    product(xp, x.stride(0), num_rows, w, in, out, yp);
  }
  if (bias.has_value()) y.add_(*bias);
  return y;
}

// Sets the way for the process; returns the way it replaces.
bool set_f32_rows_alone(bool alone) { return f32_rows_alone.exchange(alone); }

}  // namespace pdserve_cpu

TORCH_LIBRARY_FRAGMENT(pdserve, m) {
  m.def("linear(Tensor x, Tensor weight, Tensor? scales, Tensor? bias) -> Tensor");
  // No tensor to dispatch on: a kernel for every backend.
  m.def("set_f32_rows_alone(bool alone) -> bool", &pdserve_cpu::set_f32_rows_alone);
}

TORCH_LIBRARY_IMPL(pdserve, CPU, m) { m.impl("linear", &pdserve_cpu::linear); }
