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
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace {

template <typename T>
inline float dot(const float* q, const T* k, int64_t d) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < d; ++i) acc += q[i] * static_cast<float>(k[i]);
  return acc;
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

// One work item is a (sequence, kv head): its `group` query heads read each K/V row once, a
// block at a time, K and V of a block together (one pass, the softmax kept online as in flash
// decoding), the next block's rows prefetched meanwhile: the blocks lie anywhere in the pool, so
// the hardware prefetcher alone stalls at each one.
template <typename T>
void decode(const at::Tensor& query, const at::Tensor& kv_cache, const at::Tensor& block_tables,
            const at::Tensor& seq_lens, double scale, at::Tensor& out) {
  const int64_t batch = query.size(0), num_heads = query.size(1), dim = query.size(2);
  const int64_t block_size = kv_cache.size(2), num_kv_heads = kv_cache.size(3);
  const int64_t group = num_heads / num_kv_heads;
  const int64_t s_block = kv_cache.stride(0), s_kv = kv_cache.stride(1);
  const int64_t s_row = kv_cache.stride(2), s_head = kv_cache.stride(3);
  const int64_t s_table = block_tables.stride(0);
  const int64_t q_batch = query.stride(0), q_head = query.stride(1);
  const T* cache = kv_cache.const_data_ptr<T>();
  const T* q_data = query.const_data_ptr<T>();
  const int32_t* tables = block_tables.const_data_ptr<int32_t>();
  const int32_t* lens = seq_lens.const_data_ptr<int32_t>();
  T* o_data = out.mutable_data_ptr<T>();
  const float fscale = static_cast<float>(scale);

  at::parallel_for(0, batch * num_kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> q(group * dim), acc(group * dim), scores(group * block_size);
    std::vector<float> top(group), total(group);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / num_kv_heads, h = item % num_kv_heads;
      const int64_t len = lens[b];
      const int32_t* table = tables + b * s_table;
      for (int64_t g = 0; g < group; ++g) {
        const T* row = q_data + b * q_batch + (h * group + g) * q_head;
        for (int64_t i = 0; i < dim; ++i) q[g * dim + i] = static_cast<float>(row[i]) * fscale;
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      std::fill(top.begin(), top.end(), -std::numeric_limits<float>::infinity());
      std::fill(total.begin(), total.end(), 0.f);
      for (int64_t start = 0; start < len; start += block_size) {
        const T* k = cache + table[start / block_size] * s_block + h * s_head;
        const T* v = k + s_kv;
        const int64_t rows = std::min(block_size, len - start);
        if (start + block_size < len) {
          const T* next = cache + table[start / block_size + 1] * s_block + h * s_head;
          const int64_t next_rows = std::min(block_size, len - start - block_size);
          prefetch_rows(next, next_rows, s_row, dim);
          prefetch_rows(next + s_kv, next_rows, s_row, dim);
        }
        for (int64_t g = 0; g < group; ++g) {
          float* s = &scores[g * block_size];
          float block_top = top[g];
          for (int64_t r = 0; r < rows; ++r) {
            s[r] = dot(&q[g * dim], k + r * s_row, dim);
            block_top = std::max(block_top, s[r]);
          }
          const float rescale = std::exp(top[g] - block_top);  // 0 at the first block
          float* a = &acc[g * dim];
          for (int64_t i = 0; i < dim; ++i) a[i] *= rescale;
          float sum = 0.f;
          for (int64_t r = 0; r < rows; ++r) {
            const float p = std::exp(s[r] - block_top);
            sum += p;
            add_scaled(p, v + r * s_row, a, dim);
          }
          total[g] = total[g] * rescale + sum;
          top[g] = block_top;
        }
      }
      for (int64_t g = 0; g < group; ++g) {
        T* row = o_data + (b * num_heads + h * group + g) * dim;
        const float inv = 1.f / total[g];
        for (int64_t i = 0; i < dim; ++i) row[i] = static_cast<T>(acc[g * dim + i] * inv);
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
