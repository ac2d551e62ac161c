// What one model architecture (GGUF general.architecture) is, as data: the model's one forward pass
// reads it, so adding an architecture is one short file (arch_<name>.cpp) plus a line in
// architectures.cpp and a test, never a branch in a kernel. Sources of each description: the
// GGUF keys and tensor names llama.cpp's converter writes, and the model's reference implementation.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "tessera/backend.h"
#include "tessera/model.h"

namespace tessera {

// Which layers slide when the file declares ARCH.attention.sliding_window.
enum class WindowLayers : uint8_t {
  all,      // every layer (mistral, llama)
  pattern,  // layer il slides where il % window_period < window_period - 1 (gemma2: 2, gemma3: 6)
  ignored,  // the key is read as llama.cpp does: not at all (qwen2/3, phi3: full attention)
};

// How the attention score scale is chosen.
enum class AttentionScale : uint8_t {
  head_dim,   // 1/sqrt(head_dim)
  gemma_27b,  // 1/sqrt(dim / heads) for the 27B shapes (query_pre_attn_scalar = dim/heads there, as
              // llama.cpp decides by block count), else 1/sqrt(head_dim)
};

struct Architecture {
  std::string_view name;
  RopeStyle rope_style = RopeStyle::adjacent;
  FfnActivation activation = FfnActivation::silu;
  bool qkv_bias = false;       // blk.N.attn_{q,k,v}.bias required (other architectures: loaded when present)
  bool qk_norm = false;        // blk.N.attn_{q,k}_norm.weight
  bool fused_qkv = false;      // blk.N.attn_qkv.weight
  bool fused_gate_up = false;  // blk.N.ffn_up.weight = gate | up, no ffn_gate
  bool post_norms = false;     // blk.N.post_attention_norm.weight, blk.N.post_ffw_norm.weight
  bool embed_scale = false;    // embeddings * sqrt(embedding_length)
  bool softcaps = false;       // ARCH.attn_logit_softcapping, ARCH.final_logit_softcapping (defaults 50, 30)
  WindowLayers window_layers = WindowLayers::all;
  int window_period = 0;       // WindowLayers::pattern
  int64_t default_window = 0;  // the window where the file declares none (gemma2: 4096, as llama.cpp)
  float window_rope_base = 0;  // RoPE base of sliding layers, unscaled (gemma3: 10000); 0 = rope.freq_base
  AttentionScale attention_scale = AttentionScale::head_dim;
  int64_t gemma_27b_layers = 0;  // AttentionScale::gemma_27b: the 27B model's block count
};

// The description for general.architecture `name`, or null.
const Architecture* find_architecture(std::string_view name);
// Every supported name, comma-separated, for messages and `tessera plugins`.
std::string architecture_names();

}  // namespace tessera
