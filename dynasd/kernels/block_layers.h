// A Llama model's decoder layers over block weights in one call (the `block_layers` op of block_linear.cpp):
// lean_forward.py's layer loop, op for op.
#pragma once

// Why: a one-token forward spends about as long between its layers' ~45 small operations each as in the weight
// products when Python runs the loop (docs/benchmarks.md). Here the same ATen operations run in the same order on the
// same tensors, so every value is bitwise what the Python loop gives (tests/test_lean_forward.py compares the two);
// only the interpreter between them is gone. lean_forward.py calls this where every layer's projections are block
// layers, the attention is the packed grouped-query SDPA (gqa_attention.py) or, for 8-bit activations, the exact
// attention (exact_attention.h), and the caches grow in place (inplace_cache.py, whose buffers this writes into);
// every other model keeps the Python loop.

#include <ATen/ATen.h>

#include <vector>

#include "exact_attention.h"

namespace dynasd_kernels {

// y = x @ W.T over W's block panels in `format` (block_linear.cpp).
at::Tensor block_linear(const at::Tensor& x, const at::Tensor& panels, int64_t format);

// LlamaRMSNorm on float32 (lean_forward._rms_norm).
inline at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  at::Tensor variance = x.pow(2).mean({-1}, /*keepdim=*/true);
  return weight * (x * variance.add_(eps).rsqrt_());
}

// x * cos + rotate_half(x) * sin with rotate_half's sign on the sine (lean_forward._rotary).
inline at::Tensor rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& signed_sin) {
  const int64_t half = x.size(-1) / 2;
  return x * cos + at::cat({x.slice(-1, half), x.slice(-1, 0, half)}, -1) * signed_sin;
}

// hidden: (batch, q, hidden) float32; cos, signed_sin: (batch, q, 1, head_dim); mask: (1, 1, q, past + q) additive;
// per layer: norms [input, post-attention], panels [q/k/v fused, o, gate/up fused, down] with their formats, and
// the key/value buffers (batch, kv_heads, capacity, head_dim) holding `filled` positions, written at
// [filled, filled + q). Returns the last layer's hidden states.
inline at::Tensor block_layers(const at::Tensor& hidden_in, const at::Tensor& cos, const at::Tensor& signed_sin,
                               const at::Tensor& mask, at::TensorList norms, at::TensorList panels,
                               at::IntArrayRef formats, at::TensorList key_buffers, at::TensorList value_buffers,
                               int64_t filled, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t intermediate,
                               double eps, double scaling) {
  const int64_t layers = key_buffers.size();
  TORCH_CHECK(norms.size() == 2 * layers && panels.size() == 4 * layers && formats.size() == 4 * layers &&
              value_buffers.size() == layers, "block_layers needs 2 norms, 4 panels and 4 formats per layer");
  const int64_t batch = hidden_in.size(0), q_len = hidden_in.size(1), needed = filled + q_len;
  const int64_t groups = heads / kv_heads, q_size = heads * head_dim, kv_size = kv_heads * head_dim;
  // packed_gqa_sdpa's mask: tiled once per forward for several query rows; one row (or no grouping) keeps it.
  // Layers in 8-bit activations take the exact attention and the mask as it is: tiled only where SDPA reads it.
  bool sdpa = false;
  for (int64_t i = 0; i < layers; ++i) sdpa = sdpa || formats[4 * i] < 2;
  const bool packed = sdpa && groups > 1 && q_len > 1;
  const at::Tensor attention_mask = packed ? mask.slice(3, 0, needed).repeat({1, 1, groups, 1}) : mask;
  at::Tensor hidden = hidden_in;
  for (int64_t i = 0; i < layers; ++i) {
    at::Tensor x = rms_norm(hidden, norms[2 * i], eps);
    const std::vector<at::Tensor> qkv =
        at::split_with_sizes(block_linear(x, panels[4 * i], formats[4 * i]), {q_size, kv_size, kv_size}, -1);
    const at::Tensor query = rotary(qkv[0].view({batch, q_len, -1, head_dim}), cos, signed_sin).transpose(1, 2);
    const at::Tensor key = rotary(qkv[1].view({batch, q_len, -1, head_dim}), cos, signed_sin).transpose(1, 2);
    const at::Tensor value = qkv[2].view({batch, q_len, -1, head_dim}).transpose(1, 2);
    key_buffers[i].slice(2, filled, needed).copy_(key);
    value_buffers[i].slice(2, filled, needed).copy_(value);
    const at::Tensor keys = key_buffers[i].slice(2, 0, needed), values = value_buffers[i].slice(2, 0, needed);
    at::Tensor out;
    if (formats[4 * i] >= 2) {  // 8-bit activations: every row exactly what it would be alone (exact_attention.h)
      out = exact_attention_impl::attention(query, keys, values, mask, scaling);
    } else if (groups == 1) {  // transformers' sdpa_attention_forward: no grouping to pack
      out = at::scaled_dot_product_attention(query, keys, values, attention_mask, 0.0, false, scaling)
                .reshape({batch, -1, q_len, head_dim});
    } else {  // one row: transformers' pack_gqa; several: packed_gqa_sdpa's stacked rows (the same reshape)
      out = at::scaled_dot_product_attention(query.reshape({batch, kv_heads, groups * q_len, head_dim}), keys,
                                             values, attention_mask, 0.0, false, scaling)
                .reshape({batch, heads, q_len, head_dim});
    }
    out = out.transpose(1, 2).contiguous();
    hidden = hidden + block_linear(out.reshape({batch, q_len, -1}).contiguous(), panels[4 * i + 1], formats[4 * i + 1]);
    x = rms_norm(hidden, norms[2 * i + 1], eps);
    const std::vector<at::Tensor> gate_up =
        at::split_with_sizes(block_linear(x, panels[4 * i + 2], formats[4 * i + 2]), {intermediate, intermediate}, -1);
    hidden = hidden + block_linear(at::silu(gate_up[0]) * gate_up[1], panels[4 * i + 3], formats[4 * i + 3]);
  }
  return hidden;
}

}  // namespace dynasd_kernels
