// y = x @ W.T with W kept in GGUF's quantized blocks: Q4_1 (4-bit codes, a scale d and a minimum m per 32
// weights) and Q8_0 (8-bit codes and a scale d per 32 weights), for the embedded target's weights on CPU.
//
// Why: a target forward on CPU is bound by reading its weights. As float32 the embedded target's weights are
// ~540 MB; in the blocks they ship in, ~96 MB. Each weight is expanded to float32 in registers (d * q + m for
// Q4_1, d * q for Q8_0: the very values the float32 model holds, since d * q is exact in float32) and multiplied
// by every input row while it sits there. PyTorch's own int4 CPU matmul measured 15-30x slower than float32 on
// these shapes (`_weight_int4pack_mm_for_cpu`), hence this kernel.
//
// Layout ("panels", made once at load by dynasd/kernels/block_weights.py): the weight's output columns in panels
// of 32, and within a panel, for each block of 32 inputs: the 32 columns' d (float16), [Q4_1: their 32 m
// (float16)], then for each of the block's 32 inputs the 32 columns' codes (Q4_1: 16 bytes, byte j holding
// column j in its low nibble and column j + 16 in its high nibble; Q8_0: 32 signed bytes). The bytes per weight
// are those of the file: 5 bits for Q4_1, 8.5 for Q8_0.
//
// The product itself, its passes over the rows and its two variants are kernel_common.h's; here is how a block
// expands to float32 weights. Per pass over a panel: AVX-512 takes up to 12 rows over the whole panel; AVX2 (16
// registers of 8 floats) the whole panel for one row (four accumulators), or one 16-column half of it for 2-4 rows
// (Q8_0: 5), so that accumulators, scales and the expanded weights fit in 16 registers.
//
// Formats 2 and 3 multiply the same weights in 8-bit activations instead (block_int8.h), and the library also
// holds the decoder layers over these products (block_layers.h), a model's whole forward over them
// (block_forward.h) and the exact attention (exact_attention.h).
#include "kernel_common.h"
#include "block_int8.h"
#include "block_forward.h"
#include "block_layers.h"
#include "exact_attention.h"

namespace dynasd_kernels {
namespace {

constexpr int64_t BLOCK = QUANT_BLOCK;
constexpr int64_t Q4_1_BYTES = 2 * PANEL * 2 + BLOCK * PANEL / 2;  // d, m, codes: 640 per (panel, block)
constexpr int64_t Q8_0_BYTES = PANEL * 2 + BLOCK * PANEL;          // d, codes: 1088 per (panel, block)
// Reading 5-9 KB ahead keeps the weights streaming from memory: 8 blocks ahead beat one block (by ~15% for a whole
// target's layers on one row and thread), 4 came close and 16 was no better.
constexpr int64_t PREFETCH_BLOCKS = 8;

// LANES codes widened to int32 (Q4_1: LANES bytes of nibbles; Q8_0: LANES signed bytes), and as float32.
#if DYNASD_ISA_AVX512
typedef int32_t ivec __attribute__((vector_size(64)));
inline ivec widen_unsigned(const uint8_t* p) {
  return (ivec)_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline ivec widen_signed(const uint8_t* p) {
  return (ivec)_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline ivec low_nibble(ivec v) { return v & 15; }
inline ivec high_nibble(ivec v) { return v >> 4; }
inline vec to_float(ivec v) { return __builtin_convertvector(v, vec); }
inline vec multiply(vec a, vec b) { return a * b; }
#else
typedef __m256i ivec;
inline ivec widen_unsigned(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
inline ivec widen_signed(const uint8_t* p) {
  return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
inline ivec low_nibble(ivec v) { return _mm256_and_si256(v, _mm256_set1_epi32(15)); }
inline ivec high_nibble(ivec v) { return _mm256_srli_epi32(v, 4); }
inline vec to_float(ivec v) { return _mm256_cvtepi32_ps(v); }
inline vec multiply(vec a, vec b) { return _mm256_mul_ps(a, b); }
#endif

// The float16 scales (or minima) of the V vectors of columns from C0, at `offset` in a block.
template <int C0, int V>
struct Scales {
  vec v[V];
  Scales(const uint8_t* block, int64_t offset) {
    #pragma GCC unroll 16
    for (int j = 0; j < V; ++j) v[j] = load(reinterpret_cast<const _Float16*>(block + offset + 2 * (C0 + LANES * j)));
  }
};

// What the two formats share (kernel_common.h's Layout): a panel is K / 32 blocks of BYTES bytes, a group is a block.
template <int64_t BYTES, int HALF_ROWS>
struct Blocks {
  using Weight = uint8_t;
  static constexpr int64_t bytes = BYTES;
  static constexpr int64_t steps = BLOCK;
  // AVX-512: two accumulators per row stay in registers: with 32 vector registers, 12 rows (24) plus d, m, the two
  // expanded weight vectors and a broadcast.
  static constexpr int whole_rows = DYNASD_ISA_AVX512 ? 12 : 1;
  static constexpr int half_rows = DYNASD_ISA_AVX512 ? 0 : HALF_ROWS;
  static int64_t panel_size(int64_t K) { return (K / BLOCK) * BYTES; }
  // The bytes PREFETCH_BLOCKS blocks ahead, a line about every other input.
  static void read_ahead(const uint8_t* block, int64_t s) {
    if ((s & 1) == 0) __builtin_prefetch(block + PREFETCH_BLOCKS * BYTES + s * BYTES / BLOCK, 0, 3);
  }
};

// Q4_1: column c's code is the low nibble of byte c (c < 16) or the high nibble of byte c - 16.
struct Q4_1 : Blocks<Q4_1_BYTES, 4> {  // AVX2 halves: 2 accumulators a row + d, m, weights (2 each), a broadcast
  template <int C0, int V>
  struct Columns {
    const uint8_t* block;
    Scales<C0, V> d, m;
    Columns(const uint8_t* panel, int64_t g) : block(panel + g * bytes), d(block, 0), m(block, 64) {}
    void prefetch(int64_t s) const { read_ahead(block, s); }
    vec weights(int64_t s, int j) const {
      const int c = C0 + LANES * j;
      const ivec codes = widen_unsigned(block + 128 + s * 16 + (c & 15));
      // d * q is exact in float32: fused or not, d * q + m is rounded once, as the float32 model holds it
      return multiply_add(to_float(c < 16 ? low_nibble(codes) : high_nibble(codes)), d.v[j], m.v[j]);
    }
  };
};

struct Q8_0 : Blocks<Q8_0_BYTES, 5> {  // AVX2 halves: 2 accumulators a row + d, weights (2 each), a broadcast
  template <int C0, int V>
  struct Columns {
    const uint8_t* block;
    Scales<C0, V> d;
    Columns(const uint8_t* panel, int64_t g) : block(panel + g * bytes), d(block, 0) {}
    void prefetch(int64_t s) const { read_ahead(block, s); }
    vec weights(int64_t s, int j) const {
      return multiply(to_float(widen_signed(block + 64 + s * 32 + C0 + LANES * j)), d.v[j]);
    }
  };
};

}  // namespace

// x: (..., K) float32; panels: (N / 32, K / 32, bytes per block) uint8 in the layout above; format: 0 = Q4_1,
// 1 = Q8_0, 2 and 3 the same in 8-bit activations (block_int8.h's layout).
at::Tensor block_linear(const at::Tensor& x, const at::Tensor& panels, int64_t format) {
  check_inputs("block_linear", x, panels);
  TORCH_CHECK(panels.scalar_type() == at::kByte && panels.dim() == 3 && panels.is_contiguous(),
              "panels must be a contiguous (N / 32, K / 32, bytes) uint8 tensor");
  TORCH_CHECK(format >= 0 && format <= 3,
              "format must be 0 (Q4_1), 1 (Q8_0), 2 (Q4_1, 8-bit activations) or 3 (Q8_0, 8-bit activations)");
  const bool int8 = format >= 2;
  const int64_t bytes[] = {Q4_1_BYTES, Q8_0_BYTES, int8_blocks::Q4_1_BYTES, int8_blocks::Q8_0_BYTES};
  TORCH_CHECK(panels.size(2) == bytes[format], "panels hold ", panels.size(2), " bytes per block, the format ",
              bytes[format]);
  const int64_t K = panels.size(1) * BLOCK, N = panels.size(0) * (int8 ? int8_blocks::PANEL : PANEL);
  const uint8_t* wp = panels.data_ptr<uint8_t>();
  return rows_times_weight(x, K, N, [&](const float* xp, float* yp, int64_t M) {
    if (format == 0) {
      all_panels<Q4_1>(xp, wp, yp, M, K, N);
    } else if (format == 1) {
      all_panels<Q8_0>(xp, wp, yp, M, K, N);
    } else if (format == 2) {
      int8_blocks::all_panels<true>(xp, wp, yp, M, K, N);
    } else {
      int8_blocks::all_panels<false>(xp, wp, yp, M, K, N);
    }
  });
}

// Rows `ids` of a Q8_0 weight as float32 (an embedding tied to its output layer, block_weights.BlockEmbedding):
// each value d * q, the product transformers' expansion computes, read where it lies in the panels of `format` 1
// (32 columns an input) or 3 (8 columns, two inputs at a time). Why compiled: gathered with ~15 tensor operations
// a lookup cost ~65 us a forward, for 576 values.
at::Tensor block_embedding(const at::Tensor& ids, const at::Tensor& panels, int64_t format) {
  TORCH_CHECK(ids.device().is_cpu() && panels.device().is_cpu(), "block_embedding runs on CPU tensors");
  TORCH_CHECK(ids.scalar_type() == at::kLong, "block_embedding needs int64 token ids");
  TORCH_CHECK(panels.scalar_type() == at::kByte && panels.dim() == 3 && panels.is_contiguous(),
              "panels must be a contiguous (N / columns, K / 32, bytes) uint8 tensor");
  TORCH_CHECK(format == 1 || format == 3, "block_embedding reads Q8_0 panels: format 1 or 3");
  const int64_t columns = format == 1 ? PANEL : int8_blocks::PANEL, group = format == 1 ? 1 : 2;
  const int64_t block_bytes = format == 1 ? Q8_0_BYTES : int8_blocks::Q8_0_BYTES;
  TORCH_CHECK(panels.size(2) == block_bytes, "panels hold ", panels.size(2), " bytes per block, Q8_0 ", block_bytes);
  const int64_t blocks = panels.size(1), rows = panels.size(0) * columns, K = blocks * BLOCK;
  const at::Tensor flat = ids.reshape({-1}).contiguous();
  const int64_t* idp = flat.data_ptr<int64_t>();
  std::vector<int64_t> shape(ids.sizes().begin(), ids.sizes().end());
  shape.push_back(K);
  at::Tensor out = at::empty(shape, panels.options().dtype(at::kFloat));
  float* op = out.data_ptr<float>();
  const uint8_t* wp = panels.data_ptr<uint8_t>();
  for (int64_t r = 0; r < flat.numel(); ++r) {
    const int64_t id = idp[r];
    TORCH_CHECK(id >= 0 && id < rows, "token id ", id, " is outside the embedding's ", rows, " rows");
    const int64_t column = id % columns;
    const uint8_t* panel = wp + id / columns * blocks * block_bytes;
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* block = panel + b * block_bytes;
      c10::Half half;
      std::memcpy(&half, block + 2 * column, sizeof(half));
      const float d = static_cast<float>(half);
      const int8_t* codes = reinterpret_cast<const int8_t*>(block + 2 * columns);
      float* row = op + r * K + b * BLOCK;
      for (int64_t i = 0; i < BLOCK; ++i) {
        row[i] = d * static_cast<float>(codes[i / group * columns * group + column * group + i % group]);
      }
    }
  }
  return out;
}

}  // namespace dynasd_kernels

DYNASD_LIBRARY(dynasd_blocks, m) {
  m.def("block_linear(Tensor x, Tensor panels, int format) -> Tensor");
  m.def("block_layers(Tensor hidden, Tensor cos, Tensor sin, Tensor mask, Tensor[] norms, Tensor[] panels, "
        "int[] formats, Tensor(a!)[] key_buffers, Tensor(b!)[] value_buffers, int filled, int heads, int kv_heads, "
        "int head_dim, int intermediate, float eps, float scaling) -> Tensor");
  m.def("block_embedding(Tensor ids, Tensor panels, int format) -> Tensor");
  // The call's own arguments first, then the model's (lean_forward.CompiledForward passes those as one tuple).
  m.def("block_forward(int[] tokens, int[] positions, int past, int chain, Tensor? tree_mask, Tensor? features, "
        "Tensor(a!)[] key_buffers, Tensor(b!)[] value_buffers, int keep_logits, int keep_hidden, Tensor embedding, "
        "int embedding_format, Tensor? mixer, int mixer_format, Tensor cos_table, Tensor sin_table, Tensor[] norms, "
        "Tensor[] panels, int[] formats, int heads, int kv_heads, int head_dim, int intermediate, float eps, "
        "float scaling, Tensor final_norm, float final_eps, Tensor head, int head_format, Tensor? head_ids, "
        "int vocab_size) -> (Tensor, Tensor, Tensor)");
  m.def("exact_attention(Tensor query, Tensor keys, Tensor values, Tensor mask, float scaling) -> Tensor");
}
DYNASD_LIBRARY_IMPL(dynasd_blocks, m) {
  m.impl("block_linear", dynasd_kernels::block_linear);
  m.impl("block_layers", dynasd_kernels::block_layers);
  m.impl("block_embedding", dynasd_kernels::block_embedding);
  m.impl("block_forward", dynasd_kernels::block_forward);
  m.impl("exact_attention", exact_attention_impl::attention);
}
