// What the engine's CPU kernels share: the instruction set of the build, how rows are split into passes, and the
// product of a few rows of x by a weight stored as panels of 32 output columns, which both block_linear.cpp (GGUF
// blocks) and panel_linear.cpp (float32 and float16 panels) are. The product is written once here; each of those
// files says only how its panels hold the weights (a `Layout`, below).
//
// Each output y[m, n] is summed over k in the same order whatever the number of rows (one fused multiply-add per
// input, k ascending), so a row's result does not depend on the rows next to it, and both instruction sets give
// bitwise the same results.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

// The instruction set of the build, decided here only, from the compiler's flags (compile.py's VARIANT_FLAGS):
// every kernel file tests DYNASD_ISA_AVX512 and nothing else, and it names the operators' namespace (at the end).
// Both variants have AVX2, FMA and F16C, so the code written in AVX2 intrinsics alone (block_int8.h,
// exact_attention.h) needs no test.
#if defined(__AVX512F__)
#define DYNASD_ISA_AVX512 1  // 32 vector registers of 16 floats, in GCC's 16-float vectors
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define DYNASD_ISA_AVX512 0  // 16 registers of 8 floats, in intrinsics: GCC's 16-float vectors spilled there
#else
#error "the kernels need AVX-512, or AVX2 with FMA and F16C (x86-64-v3)"
#endif

namespace dynasd_kernels {

constexpr int64_t QUANT_BLOCK = 32;  // inputs per quantization block (GGUF's QK4_1 and QK8_0)

// The rows of one pass when `rows` go in passes of at most `most`, as equal as they can be (6 rows, 4 at most:
// 3 + 3, not 4 + 2): a pass of one or two rows runs at its multiply-adds' latency, not at their throughput.
inline int64_t rows_per_pass(int64_t rows, int64_t most) {
  const int64_t passes = (rows + most - 1) / most;
  return (rows + passes - 1) / passes;
}

// call(std::integral_constant<int, rows>) for 1 <= rows <= MOST: a kernel's row count is a template argument, so
// that its accumulators are registers.
template <int MOST, typename Call>
inline void with_rows(int64_t rows, Call&& call) {
  if constexpr (MOST > 1) {
    if (rows < MOST) return with_rows<MOST - 1>(rows, std::forward<Call>(call));
  }
  call(std::integral_constant<int, MOST>{});
}

// ---------------------------------------------------------------------------------------------------------------
// The vector of the instruction set: LANES floats, with the few operations the product needs.

#if DYNASD_ISA_AVX512
typedef float vec __attribute__((vector_size(64)));
constexpr int LANES = 16;
inline vec zero() { return vec{}; }
inline vec broadcast(const float* p) { return vec{} + *p; }
inline vec multiply_add(vec a, vec b, vec c) { return a * b + c; }  // one fused multiply-add (GCC contracts it)
inline vec load(const float* p) { vec v; std::memcpy(&v, p, sizeof v); return v; }
inline vec load(const _Float16* p) {  // widened exactly to float32
  return (vec)_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline void store(float* p, vec v) { std::memcpy(p, &v, sizeof v); }
#else
typedef __m256 vec;
constexpr int LANES = 8;
inline vec zero() { return _mm256_setzero_ps(); }
inline vec broadcast(const float* p) { return _mm256_broadcast_ss(p); }
inline vec multiply_add(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
inline vec load(const float* p) { return _mm256_loadu_ps(p); }
inline vec load(const _Float16* p) {  // widened exactly to float32
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline void store(float* p, vec v) { _mm256_storeu_ps(p, v); }
#endif

// ---------------------------------------------------------------------------------------------------------------
// y = x @ W.T with W as panels of PANEL output columns, each panel one contiguous run of memory that streams in
// once, in order, every weight vector used by each input row while it sits in a register.
//
// A Layout says how a panel holds its weights:
//   Weight                      the panel's element type;
//   panel_size(K)               a panel's elements, for K inputs;
//   steps                       inputs per group: a group is what is decoded at once (a GGUF block: its scales);
//   whole_rows, half_rows       the most rows per pass over the whole panel, and over one half of it (0: never in
//                               halves), so that accumulators, weights and scales fit in the registers;
//   Columns<C0, V>(panel, g)    group g's weights for the V vectors of columns from C0: prefetch(s) reads ahead
//                               at step s, weights(s, j) is vector j at step s, as float32.

constexpr int64_t PANEL = 32;              // output columns per panel
constexpr int VECTORS = PANEL / LANES;     // vectors per panel row

// MR rows of x (row stride K) times V vectors of columns from C0 of one panel, into MR rows of y (row stride N).
template <typename Layout, int MR, int C0, int V>
void rows_times_columns(const float* x, int64_t K, const typename Layout::Weight* panel, float* y, int64_t N) {
  vec acc[MR][V];
  #pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
    #pragma GCC unroll 16
    for (int j = 0; j < V; ++j) acc[i][j] = zero();
  const int64_t groups = K / Layout::steps;
  for (int64_t g = 0; g < groups; ++g) {
    const typename Layout::template Columns<C0, V> columns(panel, g);
    for (int64_t s = 0; s < Layout::steps; ++s) {
      columns.prefetch(s);
      vec w[V];
      #pragma GCC unroll 16
      for (int j = 0; j < V; ++j) w[j] = columns.weights(s, j);
      const int64_t k = g * Layout::steps + s;
      #pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) {
        const vec xi = broadcast(x + i * K + k);
        #pragma GCC unroll 16
        for (int j = 0; j < V; ++j) acc[i][j] = multiply_add(xi, w[j], acc[i][j]);
      }
    }
  }
  #pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
    #pragma GCC unroll 16
    for (int j = 0; j < V; ++j) store(y + i * N + C0 + LANES * j, acc[i][j]);
}

// MR rows times the whole panel, V vectors of columns at a time (the second half reads the panel's bytes again,
// from the core's cache).
template <typename Layout, int MR, int V, int C0 = 0>
void rows_times_panel_by(const float* x, int64_t K, const typename Layout::Weight* panel, float* y, int64_t N) {
  rows_times_columns<Layout, MR, C0, V>(x, K, panel, y, N);
  if constexpr (C0 + LANES * V < PANEL) rows_times_panel_by<Layout, MR, V, C0 + LANES * V>(x, K, panel, y, N);
}

// M > 0 rows in equal passes of at most MOST rows (rows_per_pass), each over the panel V vectors at a time.
template <typename Layout, int MOST, int V>
void passes(const float* x, int64_t M, int64_t K, const typename Layout::Weight* panel, float* y, int64_t N) {
  const int64_t per_pass = rows_per_pass(M, MOST);
  for (int64_t m = 0; m < M; m += per_pass) {
    with_rows<MOST>(std::min(per_pass, M - m), [&](auto rows) {
      rows_times_panel_by<Layout, decltype(rows)::value, V>(x + m * K, K, panel, y + m * N, N);
    });
  }
}

// M > 0 rows times one panel: up to whole_rows of them over the whole panel at once (AVX2: one or two rows, whose
// whole panel keeps four or eight chains of sums past the multiply-add's latency), more in halves.
template <typename Layout>
void rows_times_panel(const float* x, int64_t M, int64_t K, const typename Layout::Weight* panel, float* y,
                      int64_t N) {
  if constexpr (Layout::half_rows > 0) {
    if (M > Layout::whole_rows) return passes<Layout, Layout::half_rows, VECTORS / 2>(x, M, K, panel, y, N);
  }
  passes<Layout, Layout::whole_rows, VECTORS>(x, M, K, panel, y, N);
}

// x (M, K) times every panel of W (N / PANEL of them, back to back) into y (M, N), the panels shared out among the
// threads.
template <typename Layout>
void all_panels(const float* x, const typename Layout::Weight* weights, float* y, int64_t M, int64_t K, int64_t N) {
  const int64_t panel_size = Layout::panel_size(K);
  at::parallel_for(0, N / PANEL, 1, [&](int64_t first, int64_t last) {
    for (int64_t p = first; p < last; ++p) {
      rows_times_panel<Layout>(x, M, K, weights + p * panel_size, y + p * PANEL, N);
    }
  });
}

// ---------------------------------------------------------------------------------------------------------------
// The operators' frame.

// The checks every operator makes of its input x and its panels.
inline void check_inputs(const char* op, const at::Tensor& x, const at::Tensor& panels) {
  TORCH_CHECK(x.device().is_cpu() && panels.device().is_cpu(), op, " runs on CPU tensors");
  TORCH_CHECK(x.scalar_type() == at::kFloat, op, " needs float32 inputs");
}

// x (..., K) float32 times a weight of N outputs: product(x, y, M) multiplies x's rows as one contiguous (M, K)
// matrix into y (M, N), for M > 0; the result is shaped (..., N).
template <typename Product>
at::Tensor rows_times_weight(const at::Tensor& x, int64_t K, int64_t N, Product&& product) {
  TORCH_CHECK(x.size(-1) == K, "x has ", x.size(-1), " features, the weight ", K);
  const at::Tensor rows = x.reshape({-1, K}).contiguous();
  const int64_t M = rows.size(0);
  at::Tensor out = at::empty({M, N}, x.options());
  if (M > 0) product(rows.data_ptr<float>(), out.data_ptr<float>(), M);
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = N;
  return out.view(shape);
}

}  // namespace dynasd_kernels

// The operators' namespace names the variant (dynasd_avx2, dynasd_blocks_avx512, ...: compile.py's VARIANTS, by
// which fast_linear.py and block_weights.py look the operators up), so one process can load both (the tests compare
// them). It follows from the instruction set, so a library never names another variant than the one it was built
// for.
#if DYNASD_ISA_AVX512
#define DYNASD_LIBRARY(name, m) TORCH_LIBRARY(name##_avx512, m)
#define DYNASD_LIBRARY_IMPL(name, m) TORCH_LIBRARY_IMPL(name##_avx512, CPU, m)
#else
#define DYNASD_LIBRARY(name, m) TORCH_LIBRARY(name##_avx2, m)
#define DYNASD_LIBRARY_IMPL(name, m) TORCH_LIBRARY_IMPL(name##_avx2, CPU, m)
#endif
