// A model's whole forward over block weights in one call (the `block_forward` op of block_linear.cpp), from what
// cache.CachedModel.forward is given: its inputs (mask, ids, positions), the embedding lookup (and a feature draft's
// input mixer), the decoder layers (block_layers.h), the final norm and the output layer, op for op as cache.py,
// lean_forward.py, feature_draft.draft_inputs and models.SubsetHead run them.
#pragma once

// Why: with the layers compiled, what a one-layer draft's forward still did from Python (the mask, ids and
// positions, the lookup, the mixer's concatenation and product, the rotary tables' rows, the norm, the head and its
// scatter into the full vocabulary: ~20 operations, each through a module or the interpreter) took about a quarter
// of its time, more than each operation's own cost: the forward's weights have pushed the interpreter out of the
// core's caches by then. Here they are the same ATen operations in the same order on the same tensors, so every
// value is bitwise what those give (tests/test_draft_forward.py compares the two).

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <tuple>
#include <vector>

#include "block_layers.h"

namespace dynasd_kernels {

// Rows `ids` of a Q8_0 weight in `format`'s panels (block_linear.cpp).
at::Tensor block_embedding(const at::Tensor& ids, const at::Tensor& panels, int64_t format);

// The first row of Python's x[-keep:] over `rows` rows (every row for 0).
inline int64_t last_rows_start(int64_t rows, int64_t keep) { return keep > 0 ? std::max<int64_t>(rows - keep, 0) : 0; }

// cache.step_mask: (1, 1, rows, past + rows) additive. Chain rows (the first `chain`) see the cached positions and
// the chain causally; tree rows every cached position and chain row and, among the tree's columns (the last
// tree_mask.size(1)), those `tree_mask` names.
inline at::Tensor step_mask(int64_t past, int64_t chain, int64_t rows, const std::optional<at::Tensor>& tree_mask) {
  const int64_t columns = past + rows;
  at::Tensor visible = at::ones({rows, columns}, at::TensorOptions().dtype(at::kBool));
  if (chain > 0) visible.slice(0, 0, chain).slice(1, past).tril_();
  if (rows > chain) visible.slice(0, chain).slice(1, columns - tree_mask->size(1)).copy_(*tree_mask);
  return at::full({rows, columns}, -std::numeric_limits<double>::infinity(), at::TensorOptions().dtype(at::kFloat))
      .masked_fill_(visible, 0.0)
      .view({1, 1, rows, columns});
}

// The output layer over the normed hidden states `kept` (batch, k, hidden): its rows' products, scattered into
// rows of `vocab_size` -inf where `head_ids` names the rows' tokens (SubsetHead).
inline at::Tensor block_head(const at::Tensor& kept, const at::Tensor& head, int64_t head_format,
                             const std::optional<at::Tensor>& head_ids, int64_t vocab_size) {
  const at::Tensor subset = block_linear(kept, head, head_format);
  if (!head_ids.has_value()) return subset;
  std::vector<int64_t> shape = subset.sizes().vec();
  shape.back() = vocab_size;
  return at::full(shape, -std::numeric_limits<double>::infinity(), subset.options())
      .scatter_(-1, head_ids->expand(subset.sizes()), subset);
}

// tokens, positions: the step's inputs (chain, then tree nodes), `past` positions cached before them, the first
// `chain` of them causal, the rest seeing `tree_mask`'s columns; features: a feature draft's (rows, hidden) rows,
// mixed with the embeddings by the bias-free `mixer` (both or neither); the key/value buffers and the layers'
// weights as block_layers takes them; the rotary tables (position, head_dim: cos, signed sine); the final norm's
// weight and epsilon; the output layer's panels, its tokens' ids where it covers a subset of `vocab_size`.
// Returns CachedModel.forward's (logits of the last `keep_logits` rows, the final normed hidden states of the last
// max(keep_hidden, keep_logits)), and the output layer's input (1, rows kept, hidden), for its forward hooks.
inline std::tuple<at::Tensor, at::Tensor, at::Tensor> block_forward(
    at::IntArrayRef tokens, at::IntArrayRef positions, int64_t past, int64_t chain,
    const std::optional<at::Tensor>& tree_mask, const std::optional<at::Tensor>& features,
    at::TensorList key_buffers, at::TensorList value_buffers, int64_t keep_logits, int64_t keep_hidden,
    const at::Tensor& embedding, int64_t embedding_format, const std::optional<at::Tensor>& mixer,
    int64_t mixer_format, const at::Tensor& cos_table, const at::Tensor& sin_table, at::TensorList norms,
    at::TensorList panels, at::IntArrayRef formats, int64_t heads, int64_t kv_heads, int64_t head_dim,
    int64_t intermediate, double eps, double scaling, const at::Tensor& final_norm, double final_eps,
    const at::Tensor& head, int64_t head_format, const std::optional<at::Tensor>& head_ids, int64_t vocab_size) {
  const int64_t rows = tokens.size();
  TORCH_CHECK(positions.size() == tokens.size() && chain >= 0 && chain <= rows && (rows == chain || tree_mask),
              "block_forward needs a position per token, and a tree mask for the rows after the chain");
  TORCH_CHECK(features.has_value() == mixer.has_value(), "block_forward mixes feature rows with a mixer, or neither");
  const at::Tensor mask = step_mask(past, chain, rows, tree_mask);
  const at::Tensor ids = at::tensor(tokens, at::TensorOptions().dtype(at::kLong)).view({1, rows});
  const at::Tensor position_ids = at::tensor(positions, at::TensorOptions().dtype(at::kLong)).view({1, rows});
  at::Tensor hidden = block_embedding(ids, embedding, embedding_format);
  if (mixer.has_value()) {  // feature_draft.draft_inputs
    const at::Tensor rows_in = features->unsqueeze(0);
    hidden = block_linear(at::cat({hidden, rows_in.to(hidden.scalar_type())}, -1), *mixer, mixer_format);
  }
  // lean_forward's rows of the tables, (1, rows, 1, head_dim)
  const at::Tensor cos = cos_table.index({position_ids}).unsqueeze(2);
  const at::Tensor signed_sin = sin_table.index({position_ids}).unsqueeze(2);
  hidden = block_layers(hidden, cos, signed_sin, mask, norms, panels, formats, key_buffers, value_buffers, past,
                        heads, kv_heads, head_dim, intermediate, eps, scaling);
  hidden = rms_norm(hidden, final_norm, final_eps);
  const at::Tensor kept = hidden.slice(1, last_rows_start(rows, keep_logits));
  const at::Tensor logits = block_head(kept, head, head_format, head_ids, vocab_size);
  const int64_t logit_rows = logits.size(1);
  return {logits.select(0, 0).slice(0, last_rows_start(logit_rows, keep_logits)),
          hidden.select(0, 0).slice(0, last_rows_start(rows, std::max(keep_hidden, keep_logits))), kept};
}

}  // namespace dynasd_kernels
