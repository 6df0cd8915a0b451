// y = x @ W.T in integer arithmetic: each row of x quantized to 8-bit blocks, multiplied exactly with the 4- and
// 8-bit weight blocks, and a fixed float epilogue per block: block_linear.cpp's formats 2 and 3.
//
// Why: a tree verify multiplies every weight by each of its rows. In float32 (the expanded weight times the row's
// float) that is ~2 ms of arithmetic per extra row on two cores (docs/benchmarks.md, "Speed by CPU kind"), so a wide tree
// loses to ar on a CPU. As 8-bit integers, `vpmaddubsw` multiplies 32 pairs an instruction and the sums are exact,
// so a row costs a fraction of that and many verify rows cost about one ar step.
//
// The arithmetic, per row r and block b of 32 inputs (llama.cpp's Q8_0 / Q8_1 activations):
//   dx = max |x| / 127, qx = nearest(x / dx) in [-127, 127], sx = dx * sum(qx);
//   Q4_1: y += (dw * dx) * sum(qw * qx) + mw * sx        (= sum((dw qw + mw) * dx qx): the weights' exact values)
//   Q8_0: y += (dw * dx) * sum(qw * qx)
// Every integer sum is exact (Q4_1: |qw qx| sums stay below 2^15 in 16 bits per block; Q8_0: 32-bit sums), and
// the float steps run in this order for every row, whatever the number of rows beside it and whichever pass or
// thread computes it: a row's outputs are bitwise those of the same row alone (tests/test_block_weights.py).
// The code is AVX2 intrinsics, built into the AVX-512 variant as well; where that build's CPU has AVX-512 VNNI the
// products take block_vnni.h's instructions instead, the same integers and epilogue: every variant gives bitwise the
// same results.
//
// Layout (made by block_weights.to_int8_panels): panels of 8 output columns; per (panel, block):
//   Q4_1: 8 float16 d, 8 float16 m, then 4 x 32 bytes: in load t, byte 4c + j holds column c's code for input
//         8t + j (low nibble) and 8t + 4 + j (high nibble), so one load gives two steps of 4 inputs x 8 columns;
//   Q8_0: 8 float16 d, then 16 x 16 bytes: in step s, byte 2c + j holds column c's code for input 2s + j.
// Both keep the file's bytes per weight (5 and 8.5 bits).
#pragma once

#include "kernel_common.h"

namespace int8_blocks {

constexpr int64_t PANEL = 8;   // output columns per panel: one vector of 8 int32 or float lanes
constexpr int64_t BLOCK = dynasd_kernels::QUANT_BLOCK;
constexpr int64_t Q4_1_BYTES = 16 + 16 + BLOCK * PANEL / 2;  // d, m, codes: 160 per (panel, block)
constexpr int64_t Q8_0_BYTES = 16 + BLOCK * PANEL;           // d, codes: 272 per (panel, block)
constexpr int64_t PREFETCH_BLOCKS = 8;

// One call's rows of x in 8-bit blocks: codes as int8 (Q4_1's products) or widened to int16 (Q8_0's), and per
// block the scale dx, sx = dx * sum(qx) and sum(qx) itself (block_vnni.h's Q8_0).
struct QuantizedRows {
  int64_t K = 0;
  std::vector<int8_t> codes;
  std::vector<int16_t> wide;
  std::vector<float> scale, scaled_sum;
  std::vector<int32_t> code_sum;
};

// One row's block of 32 floats -> 32 codes, its scale and scaled sum; the same instructions for every row.
inline void quantize_block(const float* x, int8_t* codes, int16_t* wide, float* scale, float* scaled_sum,
                           int32_t* code_sum) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 v[4];
  __m256 amax = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_loadu_ps(x + 8 * i);
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[i]));
  }
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  const float d = _mm_cvtss_f32(m) / 127.0f;
  const float inverse = d != 0.0f ? 1.0f / d : 0.0f;
  const __m256 id = _mm256_set1_ps(inverse);
  __m256i q[4];
  __m256i total = _mm256_setzero_si256();
  for (int i = 0; i < 4; ++i) {
    q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], id));  // nearest, ties to even (the default rounding mode)
    total = _mm256_add_epi32(total, q[i]);
  }
  // int32 -> int16 -> int8, packs interleave 128-bit lanes: put them back in input order.
  const __m256i q01 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[0], q[1]), 0xD8);
  const __m256i q23 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[2], q[3]), 0xD8);
  const __m256i bytes = _mm256_permute4x64_epi64(_mm256_packs_epi16(q01, q23), 0xD8);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes), bytes);
  if (wide != nullptr) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(wide), q01);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(wide + 16), q23);
  }
  __m128i t = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
  *scale = d;
  *code_sum = _mm_cvtsi128_si32(t);
  *scaled_sum = d * static_cast<float>(*code_sum);
}

inline void quantize_rows(const float* x, int64_t M, int64_t K, bool widen, QuantizedRows& out) {
  const int64_t blocks = K / BLOCK;
  out.K = K;
  out.codes.resize(M * K);
  out.wide.resize(widen ? M * K : 0);
  out.scale.resize(M * blocks);
  out.scaled_sum.resize(M * blocks);
  out.code_sum.resize(M * blocks);
  for (int64_t r = 0; r < M; ++r) {
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t at = r * K + b * BLOCK;
      quantize_block(x + at, out.codes.data() + at, widen ? out.wide.data() + at : nullptr,
                     &out.scale[r * blocks + b], &out.scaled_sum[r * blocks + b], &out.code_sum[r * blocks + b]);
    }
  }
}

inline __m256i broadcast4(const void* p) {  // 4 bytes (4 int8 or 2 int16 codes) in every 32-bit lane
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return _mm256_set1_epi32(v);
}

// MR rows (from `row0`) times one Q4_1 panel, into columns [col0, col0 + 8) of y (row stride N).
template <int MR>
void q4_1_rows(const QuantizedRows& xq, int64_t row0, const uint8_t* panel, float* y, int64_t N, int64_t col0) {
  const int64_t K = xq.K, blocks = K / BLOCK;
  const __m256i nibble = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
  __m256 acc[MR];
  for (int r = 0; r < MR; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* block = panel + b * Q4_1_BYTES;
    __builtin_prefetch(block + PREFETCH_BLOCKS * Q4_1_BYTES, 0, 3);
    __builtin_prefetch(block + PREFETCH_BLOCKS * Q4_1_BYTES + 64, 0, 3);
    __builtin_prefetch(block + PREFETCH_BLOCKS * Q4_1_BYTES + 128, 0, 3);
    __m256i sums[MR];  // 16-bit: 8 products of at most 2 * 15 * 127 each per lane
    for (int r = 0; r < MR; ++r) sums[r] = _mm256_setzero_si256();
    #pragma GCC unroll 1
    for (int t = 0; t < 4; ++t) {
      const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 32 + 32 * t));
      const __m256i low = _mm256_and_si256(packed, nibble);
      const __m256i high = _mm256_and_si256(_mm256_srli_epi16(packed, 4), nibble);
      #pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        const int8_t* x = xq.codes.data() + (row0 + r) * K + b * BLOCK + 8 * t;
        sums[r] = _mm256_add_epi16(sums[r], _mm256_maddubs_epi16(low, broadcast4(x)));
        sums[r] = _mm256_add_epi16(sums[r], _mm256_maddubs_epi16(high, broadcast4(x + 4)));
      }
    }
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block)));
    const __m256 m = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 16)));
    #pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const int64_t at = (row0 + r) * blocks + b;
      const __m256 products = _mm256_cvtepi32_ps(_mm256_madd_epi16(sums[r], ones));
      acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(xq.scale[at])), products, acc[r]);
      acc[r] = _mm256_fmadd_ps(m, _mm256_set1_ps(xq.scaled_sum[at]), acc[r]);
    }
  }
  for (int r = 0; r < MR; ++r) _mm256_storeu_ps(y + (row0 + r) * N + col0, acc[r]);
}

// MR rows times one Q8_0 panel: 16-bit codes on both sides, `vpmaddwd` into 32-bit sums.
template <int MR>
void q8_0_rows(const QuantizedRows& xq, int64_t row0, const uint8_t* panel, float* y, int64_t N, int64_t col0) {
  const int64_t K = xq.K, blocks = K / BLOCK;
  __m256 acc[MR];
  for (int r = 0; r < MR; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* block = panel + b * Q8_0_BYTES;
    for (int line = 0; line < Q8_0_BYTES; line += 64) {
      __builtin_prefetch(block + PREFETCH_BLOCKS * Q8_0_BYTES + line, 0, 3);
    }
    __m256i sums[MR];
    for (int r = 0; r < MR; ++r) sums[r] = _mm256_setzero_si256();
    #pragma GCC unroll 1
    for (int s = 0; s < 16; ++s) {
      const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 16 + 16 * s)));
      #pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        const int16_t* x = xq.wide.data() + (row0 + r) * K + b * BLOCK + 2 * s;
        sums[r] = _mm256_add_epi32(sums[r], _mm256_madd_epi16(w, broadcast4(x)));
      }
    }
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block)));
    #pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const int64_t at = (row0 + r) * blocks + b;
      acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(xq.scale[at])), _mm256_cvtepi32_ps(sums[r]), acc[r]);
    }
  }
  for (int r = 0; r < MR; ++r) _mm256_storeu_ps(y + (row0 + r) * N + col0, acc[r]);
}

constexpr int ROWS_PER_PASS = 4;  // accumulators, sums, two weight vectors and a broadcast in 16 registers

template <bool Q4>
void rows_times_panel(int64_t rows, const QuantizedRows& xq, int64_t row0, const uint8_t* panel, float* y,
                      int64_t N, int64_t col0) {
  dynasd_kernels::with_rows<ROWS_PER_PASS>(rows, [&](auto mr) {
    constexpr int MR = decltype(mr)::value;
    if constexpr (Q4) {
      q4_1_rows<MR>(xq, row0, panel, y, N, col0);
    } else {
      q8_0_rows<MR>(xq, row0, panel, y, N, col0);
    }
  });
}

}  // namespace int8_blocks

#include "block_vnni.h"

namespace int8_blocks {

// x (M, K) float32 -> y (M, N) float32 over N / 8 panels of `format` (Q4_1 or Q8_0): with VNNI two panels at a
// time (an odd last panel by the AVX2 code, bitwise alike), else one.
template <bool Q4>
void all_panels(const float* x, const uint8_t* weights, float* y, int64_t M, int64_t K, int64_t N) {
  const int64_t step = DYNASD_INT8_VNNI ? 2 : 1, panels = N / PANEL;
  QuantizedRows xq;  // the AVX2 code's Q8_0 reads widened codes: VNNI's needs them only for an odd last panel
  quantize_rows(x, M, K, /*widen=*/!Q4 && (step == 1 || panels % 2 != 0), xq);
  const int64_t panel_bytes = (K / BLOCK) * (Q4 ? Q4_1_BYTES : Q8_0_BYTES);
  const int64_t per_pass = dynasd_kernels::rows_per_pass(M, ROWS_PER_PASS);
  at::parallel_for(0, (panels + step - 1) / step, 1, [&](int64_t first, int64_t last) {
    for (int64_t p = first * step; p < std::min(last * step, panels); p += step) {
      const uint8_t* panel = weights + p * panel_bytes;
#if DYNASD_INT8_VNNI
      if (p + 1 < panels) {
        vnni::all_rows_times_two_panels<Q4>(xq, M, panel, panel + panel_bytes, y, N, p * PANEL);
        continue;
      }
#endif
      for (int64_t m = 0; m < M; m += per_pass) {
        rows_times_panel<Q4>(std::min(per_pass, M - m), xq, m, panel, y, N, p * PANEL);
      }
    }
  });
}

}  // namespace int8_blocks
