// block_int8.h's products with AVX-512 VNNI (`vpdpbusd`), where the build's CPU has it (Intel since Cascade Lake,
// AMD Zen 4): the same integer sums, the same float epilogue, so bitwise the same outputs as the AVX2 code.
//
// Why: a verify row multiplies every weight once more. The AVX2 code multiplies 32 byte pairs an instruction into
// 16-bit sums and needs two more instructions to widen and add them; `vpdpbusd` multiplies 64 pairs (unsigned
// times signed bytes) and adds each lane's four products to its 32-bit sum in one instruction. Each instruction
// here takes 16 output columns: two of block_int8.h's 8-column panels side by side in one 512-bit register, so the
// weights' layout is the same for every variant.
//
// Per 32-input block, exactly (every sum is an integer below 2^21, no saturation anywhere):
//   Q4_1: sum(qw * qx)                                  codes 0..15 (unsigned) times the row's signed codes;
//   Q8_0: sum((qw + 128) * qx) - 128 * sum(qx)          signed codes made unsigned by +128 (a byte's top bit
//         flipped); the second term starts the sum, from the row's code sum kept at quantization.
// Then per row and block the AVX2 code's epilogue, instruction for instruction in 16 lanes instead of 8:
//   acc = fma(dw * dx, float(sum), acc) [Q4_1: acc = fma(mw, sx, acc)].
#pragma once

#include "kernel_common.h"

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define DYNASD_INT8_VNNI 1
#else
#define DYNASD_INT8_VNNI 0
#endif

#if DYNASD_INT8_VNNI
namespace int8_blocks {
namespace vnni {

constexpr int ROWS_PER_PASS = 8;  // 8 accumulators and 8 sums of 16 lanes, the weights and scales in 32 registers
// Blocks read ahead of the product (7.5 KB of each Q4_1 panel): a one-row forward streams its weights from memory,
// and 48 ahead beat block_int8.h's 8 (which the AVX2 code keeps) by ~11% of ar's tokens/s (docs/benchmarks.md).
constexpr int64_t READ_AHEAD_BLOCKS = 48;

inline __m512i two_panels(__m256i first, __m256i second) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(first), second, 1);
}
inline __m256i load256(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline __m128i load128(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
// 16 float16 values: 8 at a (first panel) and 8 at b (second panel), widened to float32.
inline __m512 halves(const uint8_t* a, const uint8_t* b) {
  return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(load128(a)), load128(b), 1));
}
inline __m512i four_codes(const int8_t* x) {  // 4 bytes in every 32-bit lane
  int32_t v;
  std::memcpy(&v, x, sizeof v);
  return _mm512_set1_epi32(v);
}

// Q8_0's steps s and s + 1 of one panel (16 bytes each: byte 2c + j = column c's input 2s + j) as 8 lanes of 4
// inputs (column c: inputs 2s .. 2s + 3).
inline __m256i four_inputs(const uint8_t* block, int s) {
  const __m128i a = load128(block + 16 + 16 * s), b = load128(block + 16 + 16 * (s + 1));
  return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_unpacklo_epi16(a, b)), _mm_unpackhi_epi16(a, b), 1);
}

// MR rows (from row0) times the panels p and p + 1 (`first`, `second`), into columns [col0, col0 + 16) of y.
template <bool Q4, int MR>
void rows_times_two_panels(const QuantizedRows& xq, int64_t row0, const uint8_t* first, const uint8_t* second,
                           float* y, int64_t N, int64_t col0) {
  const int64_t K = xq.K, blocks = K / BLOCK, bytes = Q4 ? Q4_1_BYTES : Q8_0_BYTES;
  const __m512i nibble = _mm512_set1_epi8(15), top_bit = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 acc[MR];
  for (int r = 0; r < MR; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* one = first + b * bytes;
    const uint8_t* two = second + b * bytes;
    for (int line = 0; line < bytes; line += 64) {
      __builtin_prefetch(one + READ_AHEAD_BLOCKS * bytes + line, 0, 3);
      __builtin_prefetch(two + READ_AHEAD_BLOCKS * bytes + line, 0, 3);
    }
    __m512i sums[MR];
    const int8_t* x = xq.codes.data() + row0 * K + b * BLOCK;
    if constexpr (Q4) {
      for (int r = 0; r < MR; ++r) sums[r] = _mm512_setzero_si512();
      #pragma GCC unroll 1
      for (int t = 0; t < 4; ++t) {
        const __m512i packed = two_panels(load256(one + 32 + 32 * t), load256(two + 32 + 32 * t));
        const __m512i low = _mm512_and_si512(packed, nibble);
        const __m512i high = _mm512_and_si512(_mm512_srli_epi16(packed, 4), nibble);
        #pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
          sums[r] = _mm512_dpbusd_epi32(sums[r], low, four_codes(x + r * K + 8 * t));
          sums[r] = _mm512_dpbusd_epi32(sums[r], high, four_codes(x + r * K + 8 * t + 4));
        }
      }
    } else {
      for (int r = 0; r < MR; ++r) sums[r] = _mm512_set1_epi32(-128 * xq.code_sum[(row0 + r) * blocks + b]);
      #pragma GCC unroll 1
      for (int s = 0; s < 16; s += 2) {
        const __m512i w = _mm512_xor_si512(two_panels(four_inputs(one, s), four_inputs(two, s)), top_bit);
        #pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) sums[r] = _mm512_dpbusd_epi32(sums[r], w, four_codes(x + r * K + 2 * s));
      }
    }
    const __m512 d = halves(one, two);
    #pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const int64_t at = (row0 + r) * blocks + b;
      acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(xq.scale[at])), _mm512_cvtepi32_ps(sums[r]), acc[r]);
    }
    if constexpr (Q4) {
      const __m512 m = halves(one + 16, two + 16);
      #pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(xq.scaled_sum[(row0 + r) * blocks + b]), acc[r]);
      }
    }
  }
  for (int r = 0; r < MR; ++r) _mm512_storeu_ps(y + (row0 + r) * N + col0, acc[r]);
}

// The rows in passes of at most ROWS_PER_PASS times the panels p and p + 1.
template <bool Q4>
void all_rows_times_two_panels(const QuantizedRows& xq, int64_t M, const uint8_t* first, const uint8_t* second,
                               float* y, int64_t N, int64_t col0) {
  const int64_t per_pass = dynasd_kernels::rows_per_pass(M, ROWS_PER_PASS);
  for (int64_t m = 0; m < M; m += per_pass) {
    dynasd_kernels::with_rows<ROWS_PER_PASS>(std::min(per_pass, M - m), [&](auto mr) {
      rows_times_two_panels<Q4, decltype(mr)::value>(xq, m, first, second, y, N, col0);
    });
  }
}

}  // namespace vnni
}  // namespace int8_blocks
#endif
