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

#include "fast_exp.h"
#include "ops.h"

namespace pdserve_cpu {

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

// Enough work items for every thread to stay busy at small batches: a step of one sequence
// would leave all threads but one idle.
constexpr int64_t kItemsPerThread = 4;
constexpr int64_t kMinRangeTokens = 64;  // below this a range's fixed costs outweigh the split

// Where a work item's softmax stands: every query head over one range of a sequence's
// positions, the weighted sum not yet divided by the total (flash decoding's partial result).
struct Partials {
  std::vector<float> acc, top, total;  // [items, heads, dim], [items, heads], [items, heads]
  Partials(int64_t items, int64_t heads, int64_t dim)
      : acc(items * heads * dim), top(items * heads), total(items * heads) {}
};

// The geometry of one layer's cache view and a step's queries.
struct Shape {
  int64_t num_heads, group, dim, block_size, s_block, s_kv, s_row, s_head, row_elems;
};

// One work item: every query head over positions [start, end) of a sequence (start on a block
// boundary), read a block at a time, K and V of a block together (one pass, the softmax kept
// online), every head of a row while it is in cache, the next block prefetched meanwhile: the
// blocks lie anywhere in the pool, so the hardware prefetcher alone stalls at each one. `q`
// holds the scaled queries [heads, dim]; `scores` is [heads, block_size].
template <typename T>
void attend_range(const Shape& g, const float* q, const T* cache, const int32_t* table,
                  int64_t start, int64_t end, float* scores, float* acc, float* top,
                  float* total) {
  const int64_t heads = g.num_heads, dim = g.dim, block_size = g.block_size;
  std::fill(acc, acc + heads * dim, 0.f);
  std::fill(top, top + heads, -std::numeric_limits<float>::infinity());
  std::fill(total, total + heads, 0.f);
  for (int64_t first = start; first < end; first += block_size) {
    const T* k = cache + table[first / block_size] * g.s_block;
    const T* v = k + g.s_kv;
    const int64_t rows = std::min(block_size, end - first);
    if (first + block_size < end) {
      const T* after = cache + table[first / block_size + 1] * g.s_block;
      const int64_t next_rows = std::min(block_size, end - first - block_size);
      prefetch_rows(after, next_rows, g.s_row, g.row_elems);
      prefetch_rows(after + g.s_kv, next_rows, g.s_row, g.row_elems);
    }
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t head = 0; head < heads; ++head)
        scores[head * block_size + r] =
            dot(&q[head * dim], k + r * g.s_row + (head / g.group) * g.s_head, dim);
    for (int64_t head = 0; head < heads; ++head) {
      float* s = &scores[head * block_size];
      float block_top = top[head];
      for (int64_t r = 0; r < rows; ++r) block_top = std::max(block_top, s[r]);
      const float rescale = std::exp(top[head] - block_top);  // 0 at the first block
      float* a = &acc[head * dim];
      for (int64_t i = 0; i < dim; ++i) a[i] *= rescale;
      float sum = 0.f;
#pragma omp simd reduction(+ : sum)
      for (int64_t r = 0; r < rows; ++r) sum += (s[r] = fast_exp(s[r] - block_top));
      total[head] = total[head] * rescale + sum;
      top[head] = block_top;
    }
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t head = 0; head < heads; ++head)
        add_scaled(scores[head * block_size + r], v + r * g.s_row + (head / g.group) * g.s_head,
                   &acc[head * dim], dim);
  }
}

// Work items are ranges of a sequence's positions, taken by threads as they free up: the runner
// orders decodes longest first, so even slices would leave one thread the long half. A sequence
// is cut into several ranges only when there are too few sequences to share among the threads;
// its ranges' partials are then merged per head.
template <typename T>
void decode(const at::Tensor& query, const at::Tensor& kv_cache, const at::Tensor& block_tables,
            const at::Tensor& seq_lens, double scale, at::Tensor& out) {
  const int64_t batch = query.size(0), num_heads = query.size(1), dim = query.size(2);
  const int64_t num_kv_heads = kv_cache.size(3), s_head = kv_cache.stride(3);
  const Shape g{num_heads,          num_heads / num_kv_heads, dim,
                kv_cache.size(2),   kv_cache.stride(0),       kv_cache.stride(1),
                kv_cache.stride(2), s_head,                   (num_kv_heads - 1) * s_head + dim};
  const int64_t s_table = block_tables.stride(0);
  const int64_t q_batch = query.stride(0), q_head = query.stride(1);
  const T* cache = kv_cache.const_data_ptr<T>();
  const T* q_data = query.const_data_ptr<T>();
  const int32_t* tables = block_tables.const_data_ptr<int32_t>();
  const int32_t* lens = seq_lens.const_data_ptr<int32_t>();
  T* o_data = out.mutable_data_ptr<T>();
  const float fscale = static_cast<float>(scale);
  const int64_t threads = at::get_num_threads();

  int64_t range = *std::max_element(lens, lens + batch);
  if (batch < kItemsPerThread * threads) {
    const int64_t splits = (kItemsPerThread * threads + batch - 1) / batch;
    range = std::max(kMinRangeTokens, (range + splits - 1) / splits);
  }
  range = (range + g.block_size - 1) / g.block_size * g.block_size;
  std::vector<int64_t> first_item(batch + 1, 0), seq_of;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t n = std::max<int64_t>(1, (lens[b] + range - 1) / range);
    first_item[b + 1] = first_item[b] + n;
    seq_of.insert(seq_of.end(), n, b);
  }
  const int64_t items = first_item[batch];
  Partials parts(items, num_heads, dim);

  std::atomic<int64_t> next{0};
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    std::vector<float> q(num_heads * dim), scores(num_heads * g.block_size);
    int64_t loaded = -1;  // the sequence whose queries `q` holds
    for (int64_t item = next++; item < items; item = next++) {
      const int64_t b = seq_of[item];
      const int64_t start = (item - first_item[b]) * range;
      if (b != loaded) {
        for (int64_t head = 0; head < num_heads; ++head) {
          const T* row = q_data + b * q_batch + head * q_head;
          for (int64_t i = 0; i < dim; ++i) q[head * dim + i] = static_cast<float>(row[i]) * fscale;
        }
        loaded = b;
      }
      attend_range(g, q.data(), cache, tables + b * s_table, start,
                   std::min<int64_t>(lens[b], start + range), scores.data(),
                   &parts.acc[item * num_heads * dim], &parts.top[item * num_heads],
                   &parts.total[item * num_heads]);
    }
  });

  // Each head's ranges merged, their sums rescaled to the largest score among them (a single
  // range is divided by its total, as it stands).
  at::parallel_for(0, batch * num_heads, 64, [&](int64_t begin, int64_t end) {
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / num_heads, head = bh % num_heads;
      const int64_t first = first_item[b] * num_heads + head, last = first_item[b + 1] * num_heads;
      float* acc = &parts.acc[first * dim];
      float top = parts.top[first], total = parts.total[first];
      for (int64_t at = first + num_heads; at < last; at += num_heads) {
        const float top_at = std::max(top, parts.top[at]);
        const float mine = std::exp(top - top_at), theirs = std::exp(parts.top[at] - top_at);
        const float* other = &parts.acc[at * dim];
        for (int64_t i = 0; i < dim; ++i) acc[i] = acc[i] * mine + other[i] * theirs;
        total = total * mine + parts.total[at] * theirs;
        top = top_at;
      }
      T* row = o_data + (b * num_heads + head) * dim;
      const float inv = 1.f / total;
      for (int64_t i = 0; i < dim; ++i) row[i] = static_cast<T>(acc[i] * inv);
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

}  // namespace pdserve_cpu

TORCH_LIBRARY(pdserve, m) {
  m.def("decode_attention(Tensor query, Tensor kv_cache, Tensor block_tables, Tensor seq_lens, "
        "float scale) -> Tensor");
  m.def("write_kv(Tensor key, Tensor value, Tensor(a!) kv_cache, Tensor slot_mapping) -> ()");
}

TORCH_LIBRARY_IMPL(pdserve, CPU, m) {
  m.impl("decode_attention", &pdserve_cpu::decode_attention);
  m.impl("write_kv", &pdserve_cpu::write_kv);
}
