// y = x @ W.T for a few rows of x, with W stored as panels: a CPU kernel for tree verifies.
//
// Why: a verify multiplies 2-24 rows (the tree's nodes) by every weight matrix. Reading the weights from memory
// is the real cost, and it is the same for 1 row as for 16, but MKL's few-row GEMM runs well below its one-row
// speed (docs/benchmarks.md). Here each weight is stored as panels of PANEL output columns, every panel K rows of
// PANEL floats in one contiguous block, so the weights stream from memory once, in order, and each loaded vector
// is used by every input row while it sits in a register.
//
// The product itself, its passes over the rows and its two variants are kernel_common.h's; here is how a panel
// holds its weights.
#include "kernel_common.h"

namespace dynasd_kernels {
namespace {

constexpr int64_t PREFETCH_AHEAD = 64;  // k steps (8 KB of panel) ahead; measured best among 0, 8..96

// Panels of float32 or float16 weights W: panel p holds W[p * PANEL + c, k] at [k * PANEL + c].
template <typename W>
struct Floats {
  using Weight = W;
  static constexpr int64_t steps = 1;
  // Rows per pass: their accumulators must stay in registers. AVX-512's 32 vector registers hold 14 rows' (28)
  // plus the two weight vectors and a broadcast (with passes of at most 8, a 9-row verify went as 8 + 1 and cost
  // 12% more than an 8-row one: docs/benchmarks.md). AVX2's 16 hold 6 rows' two accumulators over half the panel
  // (one cache line of a float32 panel) plus the two weight vectors and a broadcast: 15 registers.
  static constexpr int whole_rows = DYNASD_ISA_AVX512 ? 14 : 2;
  static constexpr int half_rows = DYNASD_ISA_AVX512 ? 0 : 6;
  static int64_t panel_size(int64_t K) { return K * PANEL; }
  template <int C0, int V>
  struct Columns {
    const W* w;
    Columns(const W* panel, int64_t k) : w(panel + k * PANEL + C0) {}
    void prefetch(int64_t) const {
      #pragma GCC unroll 4
      for (int c = 0; c < LANES * V; c += 16) __builtin_prefetch(w + PREFETCH_AHEAD * PANEL + c, 0, 3);
    }
    vec weights(int64_t, int j) const { return load(w + LANES * j); }
  };
};

}  // namespace

// x: (..., K) float32; panels: (N / PANEL, K, PANEL) float32 or float16, panels[p, k, c] = W[p * PANEL + c, k].
// Half-precision panels halve the bytes read (the draft's weights are stored in fp16 anyway); sums are float32.
at::Tensor panel_linear(const at::Tensor& x, const at::Tensor& panels) {
  check_inputs("panel_linear", x, panels);
  TORCH_CHECK(panels.scalar_type() == at::kFloat || panels.scalar_type() == at::kHalf,
              "panel_linear needs float32 or float16 panels");
  TORCH_CHECK(panels.dim() == 3 && panels.size(2) == PANEL && panels.is_contiguous(), "panels must be (P, K, 32)");
  const int64_t K = panels.size(1), N = panels.size(0) * PANEL;
  return rows_times_weight(x, K, N, [&](const float* xp, float* yp, int64_t M) {
    if (panels.scalar_type() == at::kFloat) {
      all_panels<Floats<float>>(xp, panels.data_ptr<float>(), yp, M, K, N);
    } else {
      all_panels<Floats<_Float16>>(xp, reinterpret_cast<const _Float16*>(panels.data_ptr<at::Half>()), yp, M, K, N);
    }
  });
}

}  // namespace dynasd_kernels

DYNASD_LIBRARY(dynasd, m) { m.def("panel_linear(Tensor x, Tensor panels) -> Tensor"); }
DYNASD_LIBRARY_IMPL(dynasd, m) { m.impl("panel_linear", dynasd_kernels::panel_linear); }
