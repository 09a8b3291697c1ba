// Paged attention on the CPU, reading K/V in place in the block pool: the native path of
// kernels/torch_attention.py's write_kv and decode_attention (same shapes and contracts; that
// file is the reference these are tested against).
//
// kv_cache: one layer's view of the block-major cache, [num_blocks, 2, block_size, Hkv, D], any
// strides but a contiguous last dim. Scores, softmax and the weighted sum run in fp32 whatever
// the cache dtype (fp32 or bf16), as the PyTorch path does.

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

// Two independent 8-lane partial sums (one accumulator would chain every multiply-add on the
// last one's latency), summed as a tree: a serial sum of the lanes would cost more than the
// products at a head dim of 64. The compiler maps each lane group to a vector register.
template <typename T>
inline float dot(const float* q, const T* k, int64_t d) {
  constexpr int64_t lanes = 8;
  float even[lanes] = {}, odd[lanes] = {};
  int64_t i = 0;
  for (; i + 2 * lanes <= d; i += 2 * lanes) {
#pragma omp simd
    for (int64_t j = 0; j < lanes; ++j) {
      even[j] += q[i + j] * static_cast<float>(k[i + j]);
      odd[j] += q[i + lanes + j] * static_cast<float>(k[i + lanes + j]);
    }
  }
  float acc = 0.f;
  for (; i < d; ++i) acc += q[i] * static_cast<float>(k[i]);
#pragma omp simd
  for (int64_t j = 0; j < lanes; ++j) even[j] += odd[j];
  return acc + ((even[0] + even[4]) + (even[1] + even[5])) +
         ((even[2] + even[6]) + (even[3] + even[7]));
}

// exp(x) for the softmax (x <= 0), as 2^n * 2^f with f in [-1/2, 1/2] by Cephes' exp2f
// polynomial (relative error ~2e-7, as std::exp's float rounding), in plain arithmetic so that
// a loop of it vectorizes. Below -87 it is 0, as the true value is below float's range.
inline float softmax_exp(float x) {
  const float t = std::max(x, -87.f) * 1.44269504088896341f;  // log2(e)
  const float n = (t + 12582912.f) - 12582912.f;  // round to nearest: 1.5 * 2^23
  const float f = t - n;
  float p = 1.535336188319500e-4f;
  p = p * f + 1.339887440266574e-3f;
  p = p * f + 9.618437357674640e-3f;
  p = p * f + 5.550332471162809e-2f;
  p = p * f + 2.402264791363012e-1f;
  p = p * f + 6.931472028550421e-1f;
  p = p * f + 1.f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

template <typename T>
inline void add_scaled(float a, const T* v, float* out, int64_t d) {
#pragma omp simd
  for (int64_t i = 0; i < d; ++i) out[i] += a * static_cast<float>(v[i]);
}

void check_cache(const at::Tensor& kv_cache) {
  TORCH_CHECK(kv_cache.dim() == 5 && kv_cache.size(1) == 2, "kv_cache: [blocks, 2, bs, Hkv, D]");
  TORCH_CHECK(kv_cache.stride(4) == 1, "kv_cache: its last dim must be contiguous");
}

template <typename T>
inline void prefetch_rows(const T* rows, int64_t count, int64_t stride, int64_t dim) {
  constexpr int64_t line = 64 / sizeof(T);
  for (int64_t r = 0; r < count; ++r)
    for (int64_t i = 0; i < dim; i += line) __builtin_prefetch(rows + r * stride + i);
}

// One work item is a sequence, read a block at a time, K and V of a block together (one pass,
// the softmax kept online as in flash decoding), every head of a row while it is in cache, the
// next block prefetched meanwhile: the blocks lie anywhere in the pool, so the hardware
// prefetcher alone stalls at each one.
template <typename T>
void decode(const at::Tensor& query, const at::Tensor& kv_cache, const at::Tensor& block_tables,
            const at::Tensor& seq_lens, double scale, at::Tensor& out) {
  const int64_t batch = query.size(0), num_heads = query.size(1), dim = query.size(2);
  const int64_t block_size = kv_cache.size(2), num_kv_heads = kv_cache.size(3);
  const int64_t group = num_heads / num_kv_heads;
  const int64_t s_block = kv_cache.stride(0), s_kv = kv_cache.stride(1);
  const int64_t s_row = kv_cache.stride(2), s_head = kv_cache.stride(3);
  const int64_t row_elems = (num_kv_heads - 1) * s_head + dim;  // a row's heads, end to end
  const int64_t s_table = block_tables.stride(0);
  const int64_t q_batch = query.stride(0), q_head = query.stride(1);
  const T* cache = kv_cache.const_data_ptr<T>();
  const T* q_data = query.const_data_ptr<T>();
  const int32_t* tables = block_tables.const_data_ptr<int32_t>();
  const int32_t* lens = seq_lens.const_data_ptr<int32_t>();
  T* o_data = out.mutable_data_ptr<T>();
  const float fscale = static_cast<float>(scale);

  // Sequences go to threads as they free up: the runner orders decodes longest first, so even
  // slices would leave one thread the long half.
  std::atomic<int64_t> next{0};
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    std::vector<float> q(num_heads * dim), acc(num_heads * dim), scores(num_heads * block_size);
    std::vector<float> top(num_heads), total(num_heads);
    for (int64_t b = next++; b < batch; b = next++) {
      const int64_t len = lens[b];
      const int32_t* table = tables + b * s_table;
      for (int64_t head = 0; head < num_heads; ++head) {
        const T* row = q_data + b * q_batch + head * q_head;
        for (int64_t i = 0; i < dim; ++i) q[head * dim + i] = static_cast<float>(row[i]) * fscale;
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      std::fill(top.begin(), top.end(), -std::numeric_limits<float>::infinity());
      std::fill(total.begin(), total.end(), 0.f);
      for (int64_t start = 0; start < len; start += block_size) {
        const T* k = cache + table[start / block_size] * s_block;
        const T* v = k + s_kv;
        const int64_t rows = std::min(block_size, len - start);
        if (start + block_size < len) {
          const T* after = cache + table[start / block_size + 1] * s_block;
          const int64_t next_rows = std::min(block_size, len - start - block_size);
          prefetch_rows(after, next_rows, s_row, row_elems);
          prefetch_rows(after + s_kv, next_rows, s_row, row_elems);
        }
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t head = 0; head < num_heads; ++head)
            scores[head * block_size + r] =
                dot(&q[head * dim], k + r * s_row + (head / group) * s_head, dim);
        for (int64_t head = 0; head < num_heads; ++head) {
          float* s = &scores[head * block_size];
          float block_top = top[head];
          for (int64_t r = 0; r < rows; ++r) block_top = std::max(block_top, s[r]);
          const float rescale = std::exp(top[head] - block_top);  // 0 at the first block
          float* a = &acc[head * dim];
          for (int64_t i = 0; i < dim; ++i) a[i] *= rescale;
          float sum = 0.f;
#pragma omp simd reduction(+ : sum)
          for (int64_t r = 0; r < rows; ++r) sum += (s[r] = softmax_exp(s[r] - block_top));
          total[head] = total[head] * rescale + sum;
          top[head] = block_top;
        }
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t head = 0; head < num_heads; ++head)
            add_scaled(scores[head * block_size + r], v + r * s_row + (head / group) * s_head,
                       &acc[head * dim], dim);
      }
      for (int64_t head = 0; head < num_heads; ++head) {
        T* row = o_data + (b * num_heads + head) * dim;
        const float inv = 1.f / total[head];
        for (int64_t i = 0; i < dim; ++i) row[i] = static_cast<T>(acc[head * dim + i] * inv);
      }
    }
  });
}

at::Tensor decode_attention(const at::Tensor& query, const at::Tensor& kv_cache,
                            const at::Tensor& block_tables, const at::Tensor& seq_lens,
                            double scale) {
  check_cache(kv_cache);
  TORCH_CHECK(query.dim() == 3 && query.stride(2) == 1, "query: [B, Hq, D], last dim contiguous");
  TORCH_CHECK(query.scalar_type() == kv_cache.scalar_type(), "query and kv_cache dtypes differ");
  TORCH_CHECK(query.size(1) % kv_cache.size(3) == 0, "query heads must be a multiple of kv heads");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && block_tables.stride(1) == 1,
              "block_tables: int32 rows");
  TORCH_CHECK(seq_lens.scalar_type() == at::kInt && seq_lens.is_contiguous(), "seq_lens: int32");
  at::Tensor out = at::empty(query.sizes(), query.options());
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, query.scalar_type(), "decode_attention", [&] {
    decode<scalar_t>(query, kv_cache, block_tables, seq_lens, scale, out);
  });
  return out;
}

template <typename T>
void write(const at::Tensor& key, const at::Tensor& value, at::Tensor& kv_cache,
           const at::Tensor& slot_mapping) {
  const int64_t tokens = key.size(0), heads = key.size(1), dim = key.size(2);
  const int64_t block_size = kv_cache.size(2);
  const int64_t s_block = kv_cache.stride(0), s_kv = kv_cache.stride(1);
  const int64_t s_row = kv_cache.stride(2), s_head = kv_cache.stride(3);
  const int64_t* slots = slot_mapping.const_data_ptr<int64_t>();
  T* cache = kv_cache.mutable_data_ptr<T>();
  const at::Tensor* halves[2] = {&key, &value};
  for (int kv = 0; kv < 2; ++kv) {
    const at::Tensor& src = *halves[kv];
    const T* data = src.const_data_ptr<T>();
    for (int64_t t = 0; t < tokens; ++t) {
      if (slots[t] < 0) continue;  // padding
      T* row = cache + (slots[t] / block_size) * s_block + kv * s_kv + (slots[t] % block_size) * s_row;
      for (int64_t h = 0; h < heads; ++h)
        std::memcpy(row + h * s_head, data + t * src.stride(0) + h * src.stride(1), dim * sizeof(T));
    }
  }
}

void write_kv(const at::Tensor& key, const at::Tensor& value, at::Tensor& kv_cache,
              const at::Tensor& slot_mapping) {
  check_cache(kv_cache);
  for (const at::Tensor* t : {&key, &value}) {
    TORCH_CHECK(t->dim() == 3 && t->stride(2) == 1, "key/value: [T, Hkv, D], last dim contiguous");
    TORCH_CHECK(t->scalar_type() == kv_cache.scalar_type(), "key/value and kv_cache dtypes differ");
  }
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.is_contiguous(),
              "slot_mapping: int64");
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, kv_cache.scalar_type(), "write_kv", [&] {
    write<scalar_t>(key, value, kv_cache, slot_mapping);
  });
}

}  // namespace

TORCH_LIBRARY(pdserve, m) {
  m.def("decode_attention(Tensor query, Tensor kv_cache, Tensor block_tables, Tensor seq_lens, "
        "float scale) -> Tensor");
  m.def("write_kv(Tensor key, Tensor value, Tensor(a!) kv_cache, Tensor slot_mapping) -> ()");
}

TORCH_LIBRARY_IMPL(pdserve, CPU, m) {
  m.impl("decode_attention", &decode_attention);
  m.impl("write_kv", &write_kv);
}
