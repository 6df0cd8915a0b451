// What the engine's CPU kernels (block_linear.cpp, panel_linear.cpp) share: the instruction-set preamble, how rows
// are split into passes, and the registration of each variant's operators under a namespace of its own.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif
#if defined(__AVX2__) && !defined(__AVX512F__)
#if !defined(__FMA__) || !defined(__F16C__)
#error "the AVX2 variant needs FMA and F16C (x86-64-v3)"
#endif
#define DYNASD_AVX2 1  // the AVX2 variant: 16 registers of 8 floats, written with intrinsics
#endif

namespace dynasd_kernels {

constexpr int64_t QUANT_BLOCK = 32;  // inputs per quantization block (GGUF's QK4_1 and QK8_0)

// The rows of one pass when `rows` go in passes of at most `most`, as equal as they can be (6 rows, 4 at most:
// 3 + 3, not 4 + 2): a pass of one or two rows runs at its multiply-adds' latency, not at their throughput.
inline int64_t rows_per_pass(int64_t rows, int64_t most) {
  const int64_t passes = (rows + most - 1) / most;
  return (rows + passes - 1) / passes;
}

}  // namespace dynasd_kernels

// The namespace names the variant (compile.py defines DYNASD_VARIANT: avx512, avx2), so one process can load both
// (the tests compare them); the extra macro levels expand the name before TORCH_LIBRARY pastes it.
#ifndef DYNASD_VARIANT
#define DYNASD_VARIANT generic
#endif
#define DYNASD_PASTE2(a, b) a##_##b
#define DYNASD_PASTE(a, b) DYNASD_PASTE2(a, b)
#define DYNASD_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)
#define DYNASD_LIBRARY_IMPL(ns, m) TORCH_LIBRARY_IMPL(ns, CPU, m)
