// y = x @ W.T for a few rows of x, with W stored as panels: a CPU kernel for tree verifies.
//
// Why: a verify multiplies 2-24 rows (the tree's nodes) by every weight matrix. Reading the weights from memory
// is the real cost, and it is the same for 1 row as for 16, but MKL's few-row GEMM runs well below its one-row
// speed (docs/benchmarks.md, 2026-12-01). Here each weight is stored as panels of PANEL output columns, every panel
// K rows of PANEL floats in one contiguous block, so the weights stream from memory once, in order, and each
// loaded vector is used by every input row while it sits in a register.
//
// Each output y[m, n] is summed over k in the same order whatever the number of rows, so a row's result does not
// depend on the rows next to it.
//
// Two variants from this one source, chosen by the build flags (compile.py picks one from the CPU's features):
// AVX-512 in GCC's 16-float vectors (one per register), and AVX2 in intrinsics (16 registers of 8 floats: the same
// vector code spilled its accumulators there, an 8-row verify ~730 ms instead of ~45). The AVX2 variant covers the
// whole panel for 1-2 rows, and one 16-column half of it (one cache line of a float32 panel) for 3-6 rows a pass.
// Both sum every output in the same order, so they give bitwise the same results.
#include "kernel_common.h"

namespace {

constexpr int64_t PANEL = 32;         // output columns per panel: two 16-float vectors
constexpr int64_t PREFETCH_AHEAD = 64;  // k steps (8 KB of panel) ahead; measured best among 0, 8..96

#if !defined(DYNASD_AVX2)
// Input rows per pass over a panel: 2 accumulators per row must stay in registers. AVX-512's 32 vector registers
// hold 14 rows' (28) plus the two weight vectors and a broadcast; elsewhere a vec16 takes two of 16 registers.
// More rows go in equal passes (16: 8 + 8, not 14 + 2): a pass of one or two rows runs at the FMA latency, not at
// its throughput. With passes of at most 8 (8 + 1), a 9-row verify cost 12% more than an 8-row one
// (docs/benchmarks.md, 2026-12-01).
#if defined(__AVX512F__)
constexpr int64_t ROWS_PER_PASS = 14;
#else
constexpr int64_t ROWS_PER_PASS = 8;
#endif

typedef float vec16 __attribute__((vector_size(64)));
typedef _Float16 half16 __attribute__((vector_size(32)));

inline vec16 load(const float* p) { vec16 v; std::memcpy(&v, p, sizeof v); return v; }
inline vec16 load(const _Float16* p) {  // half-precision panels: widened exactly to float32
#if defined(__AVX512F__)
  return (vec16)_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#else  // GCC's generic conversion goes lane by lane: slow, but right
  half16 h;
  std::memcpy(&h, p, sizeof h);
  return __builtin_convertvector(h, vec16);
#endif
}
inline void store(float* p, vec16 v) { std::memcpy(p, &v, sizeof v); }

// MR rows of x (row stride K) times one panel, written to MR rows of y (row stride N).
template <int MR, typename W>
void rows_times_panel(const float* x, int64_t K, const W* panel, float* y, int64_t N) {
  vec16 acc[MR][2];
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = vec16{};
  for (int64_t k = 0; k < K; ++k) {
    const W* w = panel + k * PANEL;
    __builtin_prefetch(w + PREFETCH_AHEAD * PANEL, 0, 3);
    __builtin_prefetch(w + PREFETCH_AHEAD * PANEL + 16, 0, 3);
    const vec16 w0 = load(w), w1 = load(w + 16);
    for (int i = 0; i < MR; ++i) {
      const vec16 xi = vec16{} + x[i * K + k];  // broadcast
      acc[i][0] += xi * w0;
      acc[i][1] += xi * w1;
    }
  }
  for (int i = 0; i < MR; ++i) {
    store(y + i * N, acc[i][0]);
    store(y + i * N + 16, acc[i][1]);
  }
}

template <typename W>
void rows_times_panel_any(int64_t rows, const float* x, int64_t K, const W* panel, float* y, int64_t N) {
  switch (rows) {
#if defined(__AVX512F__)
    case 14: return rows_times_panel<14>(x, K, panel, y, N);
    case 13: return rows_times_panel<13>(x, K, panel, y, N);
    case 12: return rows_times_panel<12>(x, K, panel, y, N);
    case 11: return rows_times_panel<11>(x, K, panel, y, N);
    case 10: return rows_times_panel<10>(x, K, panel, y, N);
    case 9: return rows_times_panel<9>(x, K, panel, y, N);
#endif
    case 8: return rows_times_panel<8>(x, K, panel, y, N);
    case 7: return rows_times_panel<7>(x, K, panel, y, N);
    case 6: return rows_times_panel<6>(x, K, panel, y, N);
    case 5: return rows_times_panel<5>(x, K, panel, y, N);
    case 4: return rows_times_panel<4>(x, K, panel, y, N);
    case 3: return rows_times_panel<3>(x, K, panel, y, N);
    case 2: return rows_times_panel<2>(x, K, panel, y, N);
    default: return rows_times_panel<1>(x, K, panel, y, N);
  }
}

template <typename W>
void rows_times_panel_passes(const float* xp, int64_t M, int64_t K, const W* panel, float* yp, int64_t N) {
  const int64_t per_pass = dynasd_kernels::rows_per_pass(M, ROWS_PER_PASS);
  for (int64_t m = 0; m < M; m += per_pass) {
    rows_times_panel_any(std::min(per_pass, M - m), xp + m * K, K, panel, yp + m * N, N);
  }
}

#else
// AVX2: V vectors of 8 columns from column C0 of the panel (V = 4: the whole panel; V = 2: one half), MR rows.
constexpr int64_t HALF_ROWS = 6;  // 2 accumulators a row + the two weight vectors and a broadcast: 15 registers

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const _Float16* p) {  // half-precision panels: widened exactly to float32
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

template <int MR, int C0, int V, typename W>
void rows_times_columns(const float* x, int64_t K, const W* panel, float* y, int64_t N) {
  __m256 acc[MR][V];
  #pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
    #pragma GCC unroll 8
    for (int j = 0; j < V; ++j) acc[i][j] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    const W* w = panel + k * PANEL + C0;
    __builtin_prefetch(w + PREFETCH_AHEAD * PANEL, 0, 3);
    if (V == 4) __builtin_prefetch(w + PREFETCH_AHEAD * PANEL + 16, 0, 3);
    __m256 wv[V];
    #pragma GCC unroll 8
    for (int j = 0; j < V; ++j) wv[j] = load8(w + 8 * j);
    #pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m256 xi = _mm256_broadcast_ss(x + i * K + k);
      #pragma GCC unroll 8
      for (int j = 0; j < V; ++j) acc[i][j] = _mm256_fmadd_ps(xi, wv[j], acc[i][j]);
    }
  }
  #pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
    #pragma GCC unroll 8
    for (int j = 0; j < V; ++j) _mm256_storeu_ps(y + i * N + C0 + 8 * j, acc[i][j]);
}

template <int C0, typename W>
void rows_times_half(int64_t rows, const float* x, int64_t K, const W* panel, float* y, int64_t N) {
  switch (rows) {
    case 6: return rows_times_columns<6, C0, 2>(x, K, panel, y, N);
    case 5: return rows_times_columns<5, C0, 2>(x, K, panel, y, N);
    case 4: return rows_times_columns<4, C0, 2>(x, K, panel, y, N);
    case 3: return rows_times_columns<3, C0, 2>(x, K, panel, y, N);
    case 2: return rows_times_columns<2, C0, 2>(x, K, panel, y, N);
    default: return rows_times_columns<1, C0, 2>(x, K, panel, y, N);
  }
}

template <typename W>
void rows_times_panel_passes(const float* xp, int64_t M, int64_t K, const W* panel, float* yp, int64_t N) {
  // One or two rows: the whole panel in one pass (four or eight chains of sums: past the FMA latency).
  if (M == 1) return rows_times_columns<1, 0, 4>(xp, K, panel, yp, N);
  if (M == 2) return rows_times_columns<2, 0, 4>(xp, K, panel, yp, N);
  const int64_t per_pass = dynasd_kernels::rows_per_pass(M, HALF_ROWS);
  for (int64_t m = 0; m < M; m += per_pass) {
    const int64_t rows = std::min(per_pass, M - m);
    rows_times_half<0>(rows, xp + m * K, K, panel, yp + m * N, N);
    rows_times_half<16>(rows, xp + m * K, K, panel, yp + m * N, N);
  }
}
#endif

template <typename W>
void all_panels(const float* xp, const W* wp, float* yp, int64_t M, int64_t K, int64_t N, int64_t count) {
  at::parallel_for(0, count, 1, [&](int64_t first, int64_t last) {
    for (int64_t p = first; p < last; ++p) rows_times_panel_passes(xp, M, K, wp + p * K * PANEL, yp + p * PANEL, N);
  });
}

// x: (..., K) float32; panels: (N / PANEL, K, PANEL) float32 or float16, panels[p, k, c] = W[p * PANEL + c, k].
// Half-precision panels halve the bytes read (the draft's weights are stored in fp16 anyway); sums are float32.
at::Tensor panel_linear(const at::Tensor& x, const at::Tensor& panels) {
  TORCH_CHECK(x.device().is_cpu() && panels.device().is_cpu(), "panel_linear runs on CPU tensors");
  TORCH_CHECK(x.scalar_type() == at::kFloat, "panel_linear needs float32 inputs");
  TORCH_CHECK(panels.scalar_type() == at::kFloat || panels.scalar_type() == at::kHalf,
              "panel_linear needs float32 or float16 panels");
  TORCH_CHECK(panels.dim() == 3 && panels.size(2) == PANEL && panels.is_contiguous(), "panels must be (P, K, 32)");
  const int64_t count = panels.size(0), K = panels.size(1), N = count * PANEL;
  TORCH_CHECK(x.size(-1) == K, "x has ", x.size(-1), " features, the weight ", K);
  const at::Tensor rows = x.reshape({-1, K}).contiguous();
  const int64_t M = rows.size(0);
  at::Tensor out = at::empty({M, N}, x.options());
  const float* xp = rows.data_ptr<float>();
  float* yp = out.data_ptr<float>();
  if (panels.scalar_type() == at::kFloat) {
    all_panels(xp, panels.data_ptr<float>(), yp, M, K, N, count);
  } else {
    all_panels(xp, reinterpret_cast<const _Float16*>(panels.data_ptr<at::Half>()), yp, M, K, N, count);
  }
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = N;
  return out.view(shape);
}

}  // namespace

DYNASD_LIBRARY(DYNASD_PASTE(dynasd, DYNASD_VARIANT), m) { m.def("panel_linear(Tensor x, Tensor panels) -> Tensor"); }
DYNASD_LIBRARY_IMPL(DYNASD_PASTE(dynasd, DYNASD_VARIANT), m) { m.impl("panel_linear", panel_linear); }
