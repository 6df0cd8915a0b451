// y = x @ W.T with W kept in GGUF's quantized blocks: Q4_1 (4-bit codes, a scale d and a minimum m per 32
// weights) and Q8_0 (8-bit codes and a scale d per 32 weights), for the embedded target's weights on CPU.
//
// Why: a target forward on CPU is bound by reading its weights. As float32 the embedded target's weights are
// ~540 MB; in the blocks they ship in, ~96 MB. Each weight is expanded to float32 in registers (d * q + m for
// Q4_1, d * q for Q8_0: the very values the float32 model holds, since d * q is exact in float32) and multiplied
// by every input row while it sits there. PyTorch's own int4 CPU matmul measured 15-30x slower than float32 on
// these shapes (../shared measurements: `_weight_int4pack_mm_for_cpu`), hence this kernel.
//
// Layout ("panels", made once at load by dynasd/kernels/block_weights.py): the weight's output columns in panels
// of 32, and within a panel, for each block of 32 inputs: the 32 columns' d (float16), [Q4_1: their 32 m
// (float16)], then for each of the block's 32 inputs the 32 columns' codes (Q4_1: 16 bytes, byte j holding
// column j in its low nibble and column j + 16 in its high nibble; Q8_0: 32 signed bytes). The bytes per weight
// are those of the file: 5 bits for Q4_1, 8.5 for Q8_0.
//
// Each output y[r, n] is summed over k in the same order whatever the number of rows, so a row's result does not
// depend on the rows next to it (a verify of 14 tree nodes gives each node what a 1-row forward gives it).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t PANEL = 32;  // output columns per panel: two 16-float vectors
constexpr int64_t BLOCK = 32;  // inputs per quantization block (GGUF's QK4_1 and QK8_0)
constexpr int64_t Q4_1_BYTES = 2 * PANEL * 2 + BLOCK * PANEL / 2;  // d, m, codes: 640 per (panel, block)
constexpr int64_t Q8_0_BYTES = PANEL * 2 + BLOCK * PANEL;          // d, codes: 1088 per (panel, block)
// Reading 5-9 KB ahead keeps the weights streaming from memory: one block ahead, a whole target's layers took 15.0 ms
// for one row on one thread, 8 blocks ahead 12.7 (4: 12.8; 16 no better; Intel Xeon, 2026-12-02).
constexpr int64_t PREFETCH_BLOCKS = 8;
#if defined(__AVX512F__)
// Two accumulators per row stay in registers: with 32 vector registers, 12 rows (24) plus d, m, the two expanded
// weight vectors and a broadcast.
constexpr int64_t ROWS_PER_PASS = 12;
#else
constexpr int64_t ROWS_PER_PASS = 4;
#endif

typedef float vec16 __attribute__((vector_size(64)));
typedef int32_t ivec16 __attribute__((vector_size(64)));
typedef uint8_t bytes16 __attribute__((vector_size(16)));
typedef int8_t sbytes16 __attribute__((vector_size(16)));
typedef _Float16 half16 __attribute__((vector_size(32)));

inline vec16 halves(const uint8_t* p) {  // 16 float16 values, widened exactly to float32
#if defined(__AVX512F__)
  return (vec16)_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#else
  half16 h;
  std::memcpy(&h, p, sizeof h);
  return __builtin_convertvector(h, vec16);
#endif
}

inline ivec16 widen_unsigned(const uint8_t* p) {
#if defined(__AVX512F__)
  return (ivec16)_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#else
  bytes16 b;
  std::memcpy(&b, p, sizeof b);
  return __builtin_convertvector(b, ivec16);
#endif
}

inline ivec16 widen_signed(const uint8_t* p) {
#if defined(__AVX512F__)
  return (ivec16)_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#else
  sbytes16 b;
  std::memcpy(&b, p, sizeof b);
  return __builtin_convertvector(b, ivec16);
#endif
}

inline void store(float* p, vec16 v) { std::memcpy(p, &v, sizeof v); }

// The two weight vectors (columns 0-15 and 16-31 of the panel) at input k of a block, as float32.
struct Q4_1 {
  static constexpr int64_t bytes = Q4_1_BYTES;
  vec16 d0, d1, m0, m1;
  const uint8_t* codes;
  explicit Q4_1(const uint8_t* block)
      : d0(halves(block)), d1(halves(block + 32)), m0(halves(block + 64)), m1(halves(block + 96)),
        codes(block + 128) {}
  inline void weights(int64_t k, vec16& w0, vec16& w1) const {
    const ivec16 packed = widen_unsigned(codes + k * 16);
    w0 = __builtin_convertvector(packed & 15, vec16) * d0 + m0;
    w1 = __builtin_convertvector(packed >> 4, vec16) * d1 + m1;
  }
};

struct Q8_0 {
  static constexpr int64_t bytes = Q8_0_BYTES;
  vec16 d0, d1;
  const uint8_t* codes;
  explicit Q8_0(const uint8_t* block) : d0(halves(block)), d1(halves(block + 32)), codes(block + 64) {}
  inline void weights(int64_t k, vec16& w0, vec16& w1) const {
    w0 = __builtin_convertvector(widen_signed(codes + k * 32), vec16) * d0;
    w1 = __builtin_convertvector(widen_signed(codes + k * 32 + 16), vec16) * d1;
  }
};

// MR rows of x (row stride K) times one panel of `blocks` blocks, written to MR rows of y (row stride N).
template <typename F, int MR>
void rows_times_panel(const float* x, int64_t K, const uint8_t* panel, float* y, int64_t N) {
  vec16 acc[MR][2];
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = vec16{};
  const int64_t blocks = K / BLOCK;
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* block = panel + b * F::bytes;
    const F format(block);
    for (int64_t kk = 0; kk < BLOCK; ++kk) {
      // The bytes PREFETCH_BLOCKS blocks ahead, a line about every other input.
      if ((kk & 1) == 0) __builtin_prefetch(block + PREFETCH_BLOCKS * F::bytes + kk * F::bytes / BLOCK, 0, 3);
      vec16 w0, w1;
      format.weights(kk, w0, w1);
      const int64_t k = b * BLOCK + kk;
      for (int i = 0; i < MR; ++i) {
        const vec16 xi = vec16{} + x[i * K + k];  // broadcast
        acc[i][0] += xi * w0;
        acc[i][1] += xi * w1;
      }
    }
  }
  for (int i = 0; i < MR; ++i) {
    store(y + i * N, acc[i][0]);
    store(y + i * N + 16, acc[i][1]);
  }
}

template <typename F>
void rows_times_panel_any(int64_t rows, const float* x, int64_t K, const uint8_t* panel, float* y, int64_t N) {
  switch (rows) {
#if defined(__AVX512F__)
    case 12: return rows_times_panel<F, 12>(x, K, panel, y, N);
    case 11: return rows_times_panel<F, 11>(x, K, panel, y, N);
    case 10: return rows_times_panel<F, 10>(x, K, panel, y, N);
    case 9: return rows_times_panel<F, 9>(x, K, panel, y, N);
    case 8: return rows_times_panel<F, 8>(x, K, panel, y, N);
    case 7: return rows_times_panel<F, 7>(x, K, panel, y, N);
    case 6: return rows_times_panel<F, 6>(x, K, panel, y, N);
    case 5: return rows_times_panel<F, 5>(x, K, panel, y, N);
#endif
    case 4: return rows_times_panel<F, 4>(x, K, panel, y, N);
    case 3: return rows_times_panel<F, 3>(x, K, panel, y, N);
    case 2: return rows_times_panel<F, 2>(x, K, panel, y, N);
    default: return rows_times_panel<F, 1>(x, K, panel, y, N);
  }
}

template <typename F>
void all_panels(const float* xp, const uint8_t* wp, float* yp, int64_t M, int64_t K, int64_t N, int64_t count) {
  const int64_t panel_bytes = (K / BLOCK) * F::bytes;
  at::parallel_for(0, count, 1, [&](int64_t first, int64_t last) {
    for (int64_t p = first; p < last; ++p) {
      // More rows go in equal passes (20: 10 + 10, not 12 + 8): a pass of one or two rows runs at the FMA latency.
      const int64_t passes = (M + ROWS_PER_PASS - 1) / ROWS_PER_PASS;
      const int64_t per_pass = (M + passes - 1) / passes;
      for (int64_t m = 0; m < M; m += per_pass) {
        rows_times_panel_any<F>(std::min(per_pass, M - m), xp + m * K, K, wp + p * panel_bytes,
                                yp + m * N + p * PANEL, N);
      }
    }
  });
}

// x: (..., K) float32; panels: (N / 32, K / 32, bytes per block) uint8 in the layout above; format: 0 = Q4_1,
// 1 = Q8_0.
at::Tensor block_linear(const at::Tensor& x, const at::Tensor& panels, int64_t format) {
  TORCH_CHECK(x.device().is_cpu() && panels.device().is_cpu(), "block_linear runs on CPU tensors");
  TORCH_CHECK(x.scalar_type() == at::kFloat, "block_linear needs float32 inputs");
  TORCH_CHECK(panels.scalar_type() == at::kByte && panels.dim() == 3 && panels.is_contiguous(),
              "panels must be a contiguous (N / 32, K / 32, bytes) uint8 tensor");
  TORCH_CHECK(format == 0 || format == 1, "format must be 0 (Q4_1) or 1 (Q8_0)");
  const int64_t bytes = format == 0 ? Q4_1_BYTES : Q8_0_BYTES;
  TORCH_CHECK(panels.size(2) == bytes, "panels hold ", panels.size(2), " bytes per block, the format ", bytes);
  const int64_t count = panels.size(0), K = panels.size(1) * BLOCK, N = count * PANEL;
  TORCH_CHECK(x.size(-1) == K, "x has ", x.size(-1), " features, the weight ", K);
  const at::Tensor rows = x.reshape({-1, K}).contiguous();
  const int64_t M = rows.size(0);
  at::Tensor out = at::empty({M, N}, x.options());
  if (M > 0) {
    const float* xp = rows.data_ptr<float>();
    const uint8_t* wp = panels.data_ptr<uint8_t>();
    float* yp = out.data_ptr<float>();
    if (format == 0) {
      all_panels<Q4_1>(xp, wp, yp, M, K, N, count);
    } else {
      all_panels<Q8_0>(xp, wp, yp, M, K, N, count);
    }
  }
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = N;
  return out.view(shape);
}

}  // namespace

TORCH_LIBRARY(dynasd_blocks, m) { m.def("block_linear(Tensor x, Tensor panels, int format) -> Tensor"); }
TORCH_LIBRARY_IMPL(dynasd_blocks, CPU, m) { m.impl("block_linear", block_linear); }
