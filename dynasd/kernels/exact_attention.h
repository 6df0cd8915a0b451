// Attention whose every output row is bitwise independent of the other query rows and of the keys it cannot see.
// Included by block_linear.cpp (the `exact_attention` op, and block_layers for 8-bit-activation layers).
//
// Why: with 8-bit activations a tiny float difference in a row's input can move one of its codes, so a verify row
// must get exactly what the same token gets alone in an ar step, or greedy decoding through a tree stops matching
// ar. Blocked softmax-attention kernels (ATen's flash attention, BLAS products) group their sums by the shape of
// the whole call: by how many query rows share it and by where the masked keys lie, so a row of a 6-row verify
// differs from the same row alone by ~1e-5.
//
// Here each (batch, head, query row) is computed on its own from the list of keys it sees, in cache order (the
// committed tokens, then its ancestors in the tree: the order of its own text), skipping masked keys altogether:
//   s_i = (q . k_i) * scaling + mask_i     the dot product in one fixed order (8-float lanes, then a fixed tree)
//   m = max s_i,  p_i = exp(s_i - m)        exp: one polynomial for every lane (exp8)
//   out = (sum_i p_i v_i) / (sum_i p_i)     both sums in key order, one key after another
// Nothing depends on the keys' positions in the cache or on the number of rows, so a row sees what it would
// alone. Keys count as masked where the additive mask is -inf (or float's lowest), as CachedModel makes it.
#pragma once

#if defined(__AVX2__)
#include <immintrin.h>

#include <cfloat>
#include <vector>

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

inline float lane_sum(__m256 v) {  // a fixed tree over the 8 lanes
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// q . k over head_dim (a multiple of 8): one accumulator, chunks in order, then lane_sum.
inline float dot(const float* q, const float* k, int64_t head_dim) {
  __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(q), _mm256_loadu_ps(k));
  for (int64_t d = 8; d < head_dim; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + d), acc);
  return lane_sum(acc);
}

constexpr int64_t MAX_HEAD_DIM = 256;

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
  TORCH_CHECK(H % KV == 0 && keys.size(0) == B && values.sizes() == keys.sizes() && keys.size(3) == D,
              "exact_attention: keys and values must be (batch, kv_heads, length, head_dim) with heads % kv_heads == 0");
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
  at::parallel_for(0, B * H * Q, 1, [&](int64_t first, int64_t last) {
    std::vector<int64_t> seen;
    std::vector<float> scores;
    for (int64_t task = first; task < last; ++task) {
      const int64_t b = task / (H * Q), h = (task / Q) % H, row = task % Q;
      const float* mask_row = mp + ((m.size(0) == 1 ? 0 : b) * Q + row) * mask_columns;
      const float* q = qp + b * query.stride(0) + h * query.stride(1) + row * query.stride(2);
      const float* k0 = kp + b * keys.stride(0) + (h / groups) * keys.stride(1);
      const float* v0 = vp + b * values.stride(0) + (h / groups) * values.stride(1);
      seen.clear();
      for (int64_t j = 0; j < L; ++j) {
        if (mask_row[j] > -FLT_MAX) seen.push_back(j);
      }
      float* o = op + task * D;
      const int64_t count = static_cast<int64_t>(seen.size());
      if (count == 0) {  // nothing visible: zeros (SDPA would give NaN)
        std::fill(o, o + D, 0.0f);
        continue;
      }
      scores.resize((count + 7) / 8 * 8);
      float top = -FLT_MAX;
      for (int64_t i = 0; i < count; ++i) {
        const int64_t j = seen[i];
        scores[i] = dot(q, k0 + j * keys.stride(2), D) * static_cast<float>(scaling) + mask_row[j];
        top = std::max(top, scores[i]);
      }
      const __m256 shift = _mm256_set1_ps(top);
      for (int64_t i = 0; i < count; i += 8) {  // the padding lanes are computed and never read
        _mm256_storeu_ps(&scores[i], exp8(_mm256_sub_ps(_mm256_loadu_ps(&scores[i]), shift)));
      }
      __m256 acc[MAX_HEAD_DIM / 8];
      const int64_t chunks = D / 8;
      for (int64_t c = 0; c < chunks; ++c) acc[c] = _mm256_setzero_ps();
      float total = 0.0f;
      for (int64_t i = 0; i < count; ++i) {
        const float* v = v0 + seen[i] * values.stride(2);
        const __m256 p = _mm256_set1_ps(scores[i]);
        for (int64_t c = 0; c < chunks; ++c) acc[c] = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 8 * c), acc[c]);
        total += scores[i];
      }
      const __m256 sum = _mm256_set1_ps(total);
      for (int64_t c = 0; c < chunks; ++c) _mm256_storeu_ps(o + 8 * c, _mm256_div_ps(acc[c], sum));
    }
  });
  return out;
}

}  // namespace exact_attention_impl
#endif
