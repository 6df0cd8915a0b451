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
//
// Two variants from this one source, chosen by the build flags (compile.py picks one from the CPU's features):
//  - AVX-512 (32 vector registers of 16 floats): one pass over a panel takes 12 rows, two accumulators each;
//  - AVX2 (16 registers of 8 floats), written with intrinsics: the same code in GCC's 16-float vectors spilled
//    its accumulators (a whole target 1.7x slower than float32 weights). A pass covers the whole panel for one row
//    (four accumulators), or one 16-column half of it for 2-4 rows (Q8_0: 5), so that accumulators, scales and
//    the expanded weights fit in 16 registers.
// Both sum every output in the same order (k ascending, one fused multiply-add per input), so the two variants
// give bitwise the same results, and neither depends on the number of rows.
#include "kernel_common.h"
#include "block_int8.h"
#include "exact_attention.h"

namespace {

constexpr int64_t PANEL = 32;  // output columns per panel: two 16-float vectors
constexpr int64_t BLOCK = dynasd_kernels::QUANT_BLOCK;
constexpr int64_t Q4_1_BYTES = 2 * PANEL * 2 + BLOCK * PANEL / 2;  // d, m, codes: 640 per (panel, block)
constexpr int64_t Q8_0_BYTES = PANEL * 2 + BLOCK * PANEL;          // d, codes: 1088 per (panel, block)
// Reading 5-9 KB ahead keeps the weights streaming from memory: one block ahead, a whole target's layers took 15.0 ms
// for one row on one thread, 8 blocks ahead 12.7 (4: 12.8; 16 no better; Intel Xeon, 2026-12-02).
constexpr int64_t PREFETCH_BLOCKS = 8;

#if !defined(DYNASD_AVX2)
// ---------------------------------------------------------------------------------------------------------------
// AVX-512 (and a generic build elsewhere): GCC's 16-float vectors, one per AVX-512 register.

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
void rows_times_panel_passes(const float* xp, int64_t M, int64_t K, const uint8_t* panel, float* yp, int64_t N) {
  const int64_t per_pass = dynasd_kernels::rows_per_pass(M, ROWS_PER_PASS);
  for (int64_t m = 0; m < M; m += per_pass) {
    rows_times_panel_any<F>(std::min(per_pass, M - m), xp + m * K, K, panel, yp + m * N, N);
  }
}

#else
// ---------------------------------------------------------------------------------------------------------------
// AVX2: 16 registers of 8 floats, intrinsics. Per pass: V vectors of 8 columns starting at column C0 of the panel
// (V = 4: the whole panel, for one row; V = 2: one half, for more rows), MR rows.

// Q4_1: column c's code is the low nibble of byte c (c < 16) or the high nibble of byte c - 16.
struct Q4_1 {
  static constexpr int64_t bytes = Q4_1_BYTES;
  static constexpr int half_rows = 4;  // 2 accumulators a row + d, m, weights (2 each) and a broadcast
  template <int C0, int V>
  struct Columns {
    __m256 d[V], m[V];
    const uint8_t* codes;
    explicit Columns(const uint8_t* block) : codes(block + 128) {
      #pragma GCC unroll 8
      for (int j = 0; j < V; ++j) {
        d[j] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 2 * (C0 + 8 * j))));
        m[j] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 64 + 2 * (C0 + 8 * j))));
      }
    }
    inline __m256 weights(int64_t k, int j) const {
      const int c = C0 + 8 * j;
      const __m256i bytes8 = _mm256_cvtepu8_epi32(
          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + k * 16 + (c & 15))));
      const __m256i q = c < 16 ? _mm256_and_si256(bytes8, _mm256_set1_epi32(15)) : _mm256_srli_epi32(bytes8, 4);
      return _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), d[j], m[j]);  // d * q is exact: the same as d * q + m
    }
  };
};

struct Q8_0 {
  static constexpr int64_t bytes = Q8_0_BYTES;
  static constexpr int half_rows = 5;  // 2 accumulators a row + d, weights (2 each) and a broadcast
  template <int C0, int V>
  struct Columns {
    __m256 d[V];
    const uint8_t* codes;
    explicit Columns(const uint8_t* block) : codes(block + 64) {
      #pragma GCC unroll 8
      for (int j = 0; j < V; ++j) {
        d[j] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 2 * (C0 + 8 * j))));
      }
    }
    inline __m256 weights(int64_t k, int j) const {
      const __m256i q = _mm256_cvtepi8_epi32(
          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + k * 32 + C0 + 8 * j)));
      return _mm256_mul_ps(_mm256_cvtepi32_ps(q), d[j]);
    }
  };
};

// MR rows of x (row stride K) times V vectors of columns from C0 of one panel, into MR rows of y (row stride N).
template <typename F, int MR, int C0, int V>
void rows_times_columns(const float* x, int64_t K, const uint8_t* panel, float* y, int64_t N) {
  __m256 acc[MR][V];
  #pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
    #pragma GCC unroll 8
    for (int j = 0; j < V; ++j) acc[i][j] = _mm256_setzero_ps();
  const int64_t blocks = K / BLOCK;
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* block = panel + b * F::bytes;
    const typename F::template Columns<C0, V> columns(block);
    for (int64_t kk = 0; kk < BLOCK; ++kk) {
      if ((kk & 1) == 0) __builtin_prefetch(block + PREFETCH_BLOCKS * F::bytes + kk * F::bytes / BLOCK, 0, 3);
      __m256 w[V];
      #pragma GCC unroll 8
      for (int j = 0; j < V; ++j) w[j] = columns.weights(kk, j);
      const int64_t k = b * BLOCK + kk;
      #pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        const __m256 xi = _mm256_broadcast_ss(x + i * K + k);
        #pragma GCC unroll 8
        for (int j = 0; j < V; ++j) acc[i][j] = _mm256_fmadd_ps(xi, w[j], acc[i][j]);
      }
    }
  }
  #pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
    #pragma GCC unroll 8
    for (int j = 0; j < V; ++j) _mm256_storeu_ps(y + i * N + C0 + 8 * j, acc[i][j]);
}

template <typename F, int C0>
void rows_times_half(int64_t rows, const float* x, int64_t K, const uint8_t* panel, float* y, int64_t N) {
  if constexpr (F::half_rows >= 5) {
    if (rows == 5) return rows_times_columns<F, 5, C0, 2>(x, K, panel, y, N);
  }
  switch (rows) {
    case 4: return rows_times_columns<F, 4, C0, 2>(x, K, panel, y, N);
    case 3: return rows_times_columns<F, 3, C0, 2>(x, K, panel, y, N);
    case 2: return rows_times_columns<F, 2, C0, 2>(x, K, panel, y, N);
    default: return rows_times_columns<F, 1, C0, 2>(x, K, panel, y, N);
  }
}

template <typename F>
void rows_times_panel_passes(const float* xp, int64_t M, int64_t K, const uint8_t* panel, float* yp, int64_t N) {
  if (M == 1) return rows_times_columns<F, 1, 0, 4>(xp, K, panel, yp, N);  // four chains: past the FMA latency
  // More rows go in equal passes, each over both halves of the panel (the second reads the panel's bytes again,
  // from the core's cache).
  const int64_t per_pass = dynasd_kernels::rows_per_pass(M, F::half_rows);
  for (int64_t m = 0; m < M; m += per_pass) {
    const int64_t rows = std::min(per_pass, M - m);
    rows_times_half<F, 0>(rows, xp + m * K, K, panel, yp + m * N, N);
    rows_times_half<F, 16>(rows, xp + m * K, K, panel, yp + m * N, N);
  }
}
#endif

template <typename F>
void all_panels(const float* xp, const uint8_t* wp, float* yp, int64_t M, int64_t K, int64_t N, int64_t count) {
  const int64_t panel_bytes = (K / BLOCK) * F::bytes;
  at::parallel_for(0, count, 1, [&](int64_t first, int64_t last) {
    for (int64_t p = first; p < last; ++p) {
      rows_times_panel_passes<F>(xp, M, K, wp + p * panel_bytes, yp + p * PANEL, N);
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
  TORCH_CHECK(format >= 0 && format <= 3,
              "format must be 0 (Q4_1), 1 (Q8_0), 2 (Q4_1, 8-bit activations) or 3 (Q8_0, 8-bit activations)");
#if !defined(__AVX2__)
  TORCH_CHECK(format < 2, "8-bit activations need the AVX2 or AVX-512 variant");
#endif
  const bool int8 = format >= 2;
  const int64_t bytes[] = {Q4_1_BYTES, Q8_0_BYTES, int8_blocks::Q4_1_BYTES, int8_blocks::Q8_0_BYTES};
  TORCH_CHECK(panels.size(2) == bytes[format], "panels hold ", panels.size(2), " bytes per block, the format ",
              bytes[format]);
  const int64_t count = panels.size(0), K = panels.size(1) * BLOCK;
  const int64_t N = count * (int8 ? int8_blocks::PANEL : PANEL);
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
    } else if (format == 1) {
      all_panels<Q8_0>(xp, wp, yp, M, K, N, count);
#if defined(__AVX2__)
    } else if (format == 2) {
      int8_blocks::all_panels<true>(xp, wp, yp, M, K, N);
    } else {
      int8_blocks::all_panels<false>(xp, wp, yp, M, K, N);
#endif
    }
  }
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = N;
  return out.view(shape);
}


#include "block_layers.h"

}  // namespace

DYNASD_LIBRARY(DYNASD_PASTE(dynasd_blocks, DYNASD_VARIANT), m) {
  m.def("block_linear(Tensor x, Tensor panels, int format) -> Tensor");
  m.def("block_layers(Tensor hidden, Tensor cos, Tensor sin, Tensor mask, Tensor[] norms, Tensor[] panels, "
        "int[] formats, Tensor(a!)[] key_buffers, Tensor(b!)[] value_buffers, int filled, int heads, int kv_heads, "
        "int head_dim, int intermediate, float eps, float scaling) -> Tensor");
  m.def("exact_attention(Tensor query, Tensor keys, Tensor values, Tensor mask, float scaling) -> Tensor");
}
DYNASD_LIBRARY_IMPL(DYNASD_PASTE(dynasd_blocks, DYNASD_VARIANT), m) {
  m.impl("block_linear", block_linear);
  m.impl("block_layers", block_layers);
#if defined(__AVX2__)
  m.impl("exact_attention", exact_attention_impl::attention);
#endif
}
