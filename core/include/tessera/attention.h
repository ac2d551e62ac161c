// Attention: for a ragged batch of sequences, store this step's K/V in the cache and attend over
// each sequence's cached context. Heads: MHA, GQA and MQA follow from n_heads / n_kv_heads.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "tessera/backend.h"
#include "tessera/kv_layout.h"

namespace tessera {

struct AttentionShape {
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t window = 0;  // sliding window declared by the model; 0 = none
  // Per layer, 1 where `window` applies (Gemma 2 and 3 alternate local and global layers); empty:
  // every layer.
  std::vector<uint8_t> layer_slides;
  float scale = 0.0f;    // score scale; 0 = 1/sqrt(head_dim)
  float softcap = 0.0f;  // AttentionArgs::softcap; 0 = none
};

// The window layer `layer` attends with: the shape's where the layer slides, else 0 (full causal).
inline int64_t layer_window(const AttentionShape& shape, int64_t layer) {
  if (shape.layer_slides.empty()) return shape.window;
  return layer >= 0 && layer < static_cast<int64_t>(shape.layer_slides.size()) &&
                 shape.layer_slides[static_cast<size_t>(layer)] != 0
             ? shape.window
             : 0;
}

// The batch for one step, prepared once and shared by every layer.
struct AttentionStep {
  int64_t n_tokens = 0;
  const int32_t* slots = nullptr;  // backend memory: KV slot of each token
  const AttentionSeqDesc* seqs = nullptr;  // backend memory
  const int32_t* block_tables = nullptr;   // backend memory
  std::span<const AttentionSeqDesc> host_seqs;  // the same descriptors in host memory
  // Per sequence, in host_seqs' order: 1 where its queries verify speculative drafts, so each
  // query's output must be a one-token decode step's (an attention that approximates prefill, such
  // as block-sparse, stays exact there, or greedy speculation would change the tokens). May be
  // empty (a caller that never verifies): read it only below its size.
  std::span<const uint8_t> host_verifies;
  int32_t max_q_len = 0;
  int32_t max_context_len = 0;
  int64_t layer = 0;  // the layer being run: which of the shape's per-layer settings apply
};

// The dense attention call for a step (the shape's scale, soft cap and the layer's window).
inline AttentionArgs dense_attention_args(const AttentionStep& step, const AttentionShape& shape, const float* q,
                                          float* out) {
  AttentionArgs args;
  args.q = q;
  args.out = out;
  args.n_tokens = step.n_tokens;
  args.n_heads = shape.n_heads;
  args.scale = shape.scale > 0 ? shape.scale : 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
  args.softcap = shape.softcap;
  args.window = layer_window(shape, step.layer);
  args.seqs = step.seqs;
  args.n_seqs = static_cast<int64_t>(step.host_seqs.size());
  args.block_tables = step.block_tables;
  args.max_q_len = step.max_q_len;
  args.max_context_len = step.max_context_len;
  return args;
}

class Attention {
 public:
  virtual ~Attention() = default;
  virtual void configure(const AttentionShape& shape) = 0;
  // Backend ops this plugin calls, checked when the pipeline is built.
  virtual std::vector<OpRequirement> requirements(DType kv_dtype) const = 0;
  // q: [n_tokens][n_heads*head_dim] (RoPE applied); k, v: [n_tokens][n_kv_heads*head_dim];
  // out: [n_tokens][n_heads*head_dim]. All backend memory.
  virtual void forward(Backend& backend, const AttentionStep& step, const KvLayerView& kv,
                       const float* q, const float* k, const float* v, float* out) = 0;
};

}  // namespace tessera
