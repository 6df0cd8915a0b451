// Attention whose every output row is bitwise independent of the other query rows and of the keys it cannot see.
// block_linear.cpp's `exact_attention` op, and block_layers.h's attention for 8-bit-activation layers.
//
// Why: with 8-bit activations a tiny float difference in a row's input can move one of its codes, so a verify row
// must get exactly what the same token gets alone in an ar step, or greedy decoding through a tree stops matching
// ar. Blocked softmax-attention kernels (ATen's flash attention, BLAS products) group their sums by the shape of
// the whole call: by how many query rows share it and by where the masked keys lie, so a row of a 6-row verify
// differs from the same row alone by ~1e-5.
//
// Here each (batch, head, query row) is computed on its own from the list of keys it sees, in cache order (the
// committed tokens, then its ancestors in the tree: the order of its own text), skipping masked keys altogether:
//   s_i = (q . k_i) * scaling + mask_i     the dot product in one fixed order (dots8)
//   m = max s_i,  p_i = exp(s_i - m)        exp: one polynomial for every lane (exp8)
//   out = (sum_i p_i v_i) / (sum_i p_i)     both sums in key order, one key after another
// Nothing depends on the keys' positions in the cache or on the number of rows, so a row sees what it would
// alone. Keys count as masked where the additive mask is -inf (or float's lowest), as CachedModel makes it.
#pragma once

#include <cfloat>

#include "kernel_common.h"

namespace exact_attention_impl {

// e^x for 8 floats (x <= 0 here), Cephes' expf polynomial: the same instructions for every lane and call.
inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  const __m256i exponent = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(exponent));
}

// The dot products of q with 8 keys (head_dim a multiple of 8). Each key's is computed the same way whatever keys
// share the call: 8 lanes over the head dimension's chunks in order (one multiply, then fused multiply-adds), then
// the lanes summed as ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)), here by one transposing network for the 8.
inline __m256 dots8(const float* q, const float* const* k, int64_t head_dim) {
  __m256 acc[8];
  const __m256 q0 = _mm256_loadu_ps(q);
  for (int j = 0; j < 8; ++j) acc[j] = _mm256_mul_ps(q0, _mm256_loadu_ps(k[j]));
  for (int64_t d = 8; d < head_dim; d += 8) {
    const __m256 qd = _mm256_loadu_ps(q + d);
    for (int j = 0; j < 8; ++j) acc[j] = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k[j] + d), acc[j]);
  }
  const __m256 g0 = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]), _mm256_hadd_ps(acc[2], acc[3]));
  const __m256 g1 = _mm256_hadd_ps(_mm256_hadd_ps(acc[4], acc[5]), _mm256_hadd_ps(acc[6], acc[7]));
  return _mm256_add_ps(_mm256_permute2f128_ps(g0, g1, 0x20), _mm256_permute2f128_ps(g0, g1, 0x31));
}

// o = (sum_i p_i v_i) / (sum_i p_i) over the keys seen, in their order: CHUNKS vectors of 8 accumulators kept in
// registers (a head size known when compiled), or in memory for other sizes; the same order either way.
template <int CHUNKS>
inline void weighted_sum_of(const float* p, const int64_t* seen, int64_t count, const float* v0, int64_t stride,
                            int64_t chunks, float* o) {
  constexpr int kept = CHUNKS > 0 ? CHUNKS : 32;
  const int64_t n = CHUNKS > 0 ? CHUNKS : chunks;
  __m256 acc[kept];
  for (int64_t c = 0; c < n; ++c) acc[c] = _mm256_setzero_ps();
  float total = 0.0f;
  for (int64_t i = 0; i < count; ++i) {
    const float* v = v0 + seen[i] * stride;
    const __m256 weight = _mm256_set1_ps(p[i]);
    for (int64_t c = 0; c < n; ++c) acc[c] = _mm256_fmadd_ps(weight, _mm256_loadu_ps(v + 8 * c), acc[c]);
    total += p[i];
  }
  const __m256 sum = _mm256_set1_ps(total);
  for (int64_t c = 0; c < n; ++c) _mm256_storeu_ps(o + 8 * c, _mm256_div_ps(acc[c], sum));
}

inline void weighted_sum(const float* p, const int64_t* seen, int64_t count, const float* v0, int64_t stride,
                         int64_t head_dim, float* o) {
  switch (head_dim) {
    case 64: return weighted_sum_of<8>(p, seen, count, v0, stride, 8, o);
    case 128: return weighted_sum_of<16>(p, seen, count, v0, stride, 16, o);
    case 8: return weighted_sum_of<1>(p, seen, count, v0, stride, 1, o);
    default: return weighted_sum_of<0>(p, seen, count, v0, stride, head_dim / 8, o);
  }
}

// weighted_sum for three query heads of one KV head and a head size of 64 (the embedded target's): each key's
// values are read once for the three, half the head at a time (3 x 4 accumulators and 3 weights in 16 registers),
// or with AVX-512 the whole head at once (3 x 4 registers of 16 floats). Every output element sums its keys'
// p_i * v_i[d] one key after another in the same order, with the same fused multiply-adds, then divides by the same
// total, however its lanes are grouped into registers: the results are weighted_sum's, bit for bit, in every
// variant (tests/test_int8_arithmetic.py compares them).
inline void weighted_sums_of_three(const float* p, int64_t padded, const int64_t* seen, int64_t count,
                                   const float* v0, int64_t stride, float* const* o) {
  float total[3] = {0.0f, 0.0f, 0.0f};
  for (int64_t i = 0; i < count; ++i) {
    for (int t = 0; t < 3; ++t) total[t] += p[t * padded + i];
  }
#if DYNASD_ISA_AVX512
  __m512 acc[3][4];
  for (int t = 0; t < 3; ++t)
    for (int c = 0; c < 4; ++c) acc[t][c] = _mm512_setzero_ps();
  for (int64_t i = 0; i < count; ++i) {
    const float* v = v0 + seen[i] * stride;
    const __m512 values[4] = {_mm512_loadu_ps(v), _mm512_loadu_ps(v + 16), _mm512_loadu_ps(v + 32),
                              _mm512_loadu_ps(v + 48)};
    for (int t = 0; t < 3; ++t) {
      const __m512 weight = _mm512_set1_ps(p[t * padded + i]);
      for (int c = 0; c < 4; ++c) acc[t][c] = _mm512_fmadd_ps(weight, values[c], acc[t][c]);
    }
  }
  for (int t = 0; t < 3; ++t) {
    const __m512 sum = _mm512_set1_ps(total[t]);
    for (int c = 0; c < 4; ++c) _mm512_storeu_ps(o[t] + 16 * c, _mm512_div_ps(acc[t][c], sum));
  }
#else
  for (int half = 0; half < 2; ++half) {
    __m256 acc[3][4];
    for (int t = 0; t < 3; ++t)
      for (int c = 0; c < 4; ++c) acc[t][c] = _mm256_setzero_ps();
    for (int64_t i = 0; i < count; ++i) {
      const float* v = v0 + seen[i] * stride + 32 * half;
      for (int t = 0; t < 3; ++t) {
        const __m256 weight = _mm256_set1_ps(p[t * padded + i]);
        for (int c = 0; c < 4; ++c) acc[t][c] = _mm256_fmadd_ps(weight, _mm256_loadu_ps(v + 8 * c), acc[t][c]);
      }
    }
    for (int t = 0; t < 3; ++t) {
      const __m256 sum = _mm256_set1_ps(total[t]);
      for (int c = 0; c < 4; ++c) _mm256_storeu_ps(o[t] + 32 * half + 8 * c, _mm256_div_ps(acc[t][c], sum));
    }
  }
#endif
}

constexpr int64_t MAX_HEAD_DIM = 256;
constexpr int64_t MAX_GROUPS = 64;

// query: (B, H, Q, D) any strides with the last 1; keys, values: (B, KV, L, D), likewise; mask: (B or 1, 1, Q, >= L)
// additive float32. Returns (B, H, Q, D) contiguous.
inline at::Tensor attention(const at::Tensor& query, const at::Tensor& keys, const at::Tensor& values,
                            const at::Tensor& mask, double scaling) {
  TORCH_CHECK(query.dim() == 4 && keys.dim() == 4 && values.dim() == 4 && mask.dim() == 4,
              "exact_attention takes 4-d query, keys, values and mask");
  TORCH_CHECK(query.scalar_type() == at::kFloat && keys.scalar_type() == at::kFloat &&
              values.scalar_type() == at::kFloat && mask.scalar_type() == at::kFloat,
              "exact_attention runs on float32");
  const int64_t B = query.size(0), H = query.size(1), Q = query.size(2), D = query.size(3);
  const int64_t KV = keys.size(1), L = keys.size(2);
  TORCH_CHECK(D % 8 == 0 && D <= MAX_HEAD_DIM, "exact_attention needs a head size that is a multiple of 8, <= 256");
  TORCH_CHECK(H % KV == 0 && H / KV <= MAX_GROUPS && keys.size(0) == B && values.sizes() == keys.sizes() && keys.size(3) == D,
              "exact_attention: keys and values must be (batch, kv_heads, length, head_dim), heads a multiple of "
              "kv_heads, at most 64 times");
  TORCH_CHECK(query.stride(3) == 1 && keys.stride(3) == 1 && values.stride(3) == 1,
              "exact_attention needs the head dimension contiguous");
  TORCH_CHECK((mask.size(0) == B || mask.size(0) == 1) && mask.size(2) == Q && mask.size(3) >= L,
              "exact_attention's mask must be (batch or 1, 1, queries, >= keys)");
  const at::Tensor m = mask.contiguous();
  at::Tensor out = at::empty({B, H, Q, D}, query.options());
  const float* qp = query.data_ptr<float>();
  const float* kp = keys.data_ptr<float>();
  const float* vp = values.data_ptr<float>();
  const float* mp = m.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t groups = H / KV, mask_columns = m.size(3);
  const std::vector<float> zero_key(D, 0.0f);
  const float* zeros = zero_key.data();
  // One task per (batch, KV head, query row): the `groups` query heads that read one KV head see the same keys, so
  // they share the list of keys and each key's bytes while they are in the core's nearest cache.
  at::parallel_for(0, B * KV * Q, 1, [&](int64_t first, int64_t last) {
    std::vector<int64_t> seen;
    std::vector<float> scores;
    for (int64_t task = first; task < last; ++task) {
      const int64_t b = task / (KV * Q), g = (task / Q) % KV, row = task % Q;
      const float* mask_row = mp + ((m.size(0) == 1 ? 0 : b) * Q + row) * mask_columns;
      const float* k0 = kp + b * keys.stride(0) + g * keys.stride(1);
      const float* v0 = vp + b * values.stride(0) + g * values.stride(1);
      const float* q[MAX_GROUPS];
      float* o[MAX_GROUPS];
      for (int64_t t = 0; t < groups; ++t) {
        const int64_t h = g * groups + t;
        q[t] = qp + b * query.stride(0) + h * query.stride(1) + row * query.stride(2);
        o[t] = op + ((b * H + h) * Q + row) * D;
      }
      seen.clear();
      for (int64_t j = 0; j < L; ++j) {
        if (mask_row[j] > -FLT_MAX) seen.push_back(j);
      }
      const int64_t count = static_cast<int64_t>(seen.size());
      if (count == 0) {  // nothing visible: zeros (SDPA would give NaN)
        for (int64_t t = 0; t < groups; ++t) std::fill(o[t], o[t] + D, 0.0f);
        continue;
      }
      const int64_t padded = (count + 7) / 8 * 8;
      scores.resize(padded * groups);
      const __m256 scale = _mm256_set1_ps(static_cast<float>(scaling));
      for (int64_t i = 0; i < padded; i += 8) {  // keys past `count` read zeros, their scores are never used
        const float* k[8];
        float added[8];
        for (int j = 0; j < 8; ++j) {
          const bool real = i + j < count;
          k[j] = real ? k0 + seen[i + j] * keys.stride(2) : zeros;
          added[j] = real ? mask_row[seen[i + j]] : 0.0f;
        }
        for (int64_t t = 0; t < groups; ++t) {
          _mm256_storeu_ps(&scores[t * padded + i], _mm256_fmadd_ps(dots8(q[t], k, D), scale, _mm256_loadu_ps(added)));
        }
      }
      for (int64_t t = 0; t < groups; ++t) {
        float* p = &scores[t * padded];
        float top = -FLT_MAX;
        for (int64_t i = 0; i < count; ++i) top = std::max(top, p[i]);
        const __m256 shift = _mm256_set1_ps(top);
        for (int64_t i = 0; i < count; i += 8) {  // the padding lanes are computed and never read
          _mm256_storeu_ps(p + i, exp8(_mm256_sub_ps(_mm256_loadu_ps(p + i), shift)));
        }
      }
      if (groups == 3 && D == 64) {
        weighted_sums_of_three(scores.data(), padded, seen.data(), count, v0, values.stride(2), o);
      } else {
        for (int64_t t = 0; t < groups; ++t) {
          weighted_sum(&scores[t * padded], seen.data(), count, v0, values.stride(2), D, o[t]);
        }
      }
    }
  });
  return out;
}

}  // namespace exact_attention_impl
