// Synthetic Llama models for performance work: a valid llama-architecture GGUF of any shape with
// seeded random weights and a SentencePiece-style vocabulary, written exactly as llama.cpp's
// converter names and types things, so other GGUF readers load it too.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/dtype.h"
#include "tessera/tokenizer.h"

namespace tessera {

struct SynthSpec {
  std::string preset;  // written into general.name; "custom" when built by hand
  // general.architecture: llama, mistral, qwen2, qwen3, phi3, gemma, gemma2, gemma3 — each written with
  // the tensors and keys llama.cpp's converter gives it (biases, q/k norms, fused tensors, post-norms,
  // soft caps, window pattern; gemma's head tied). Norms and biases are random where the
  // architecture has them, so that a reader that skips one gives other logits.
  std::string arch = "llama";
  int64_t head_dim = 0;        // attention.key_length; 0 = dim / heads (then not written)
  int64_t sliding_window = 0;  // attention.sliding_window for mistral/gemma2/gemma3; 0 = context / 4 for gemma2/3
  std::string rope_scaling = "none";  // none, linear, yarn (rope.scaling.*) or freqs (rope_freqs.weight)
  // A GGUF whose tokenizer.* keys (a real vocabulary, e.g. ../shared/vocab/*.gguf) are copied in;
  // vocab is then its token count. Empty: the synthetic SentencePiece vocabulary of `vocab` tokens.
  std::string vocab_file;
  double rope_factor = 4.0;           // the scaling factor (linear, yarn)
  int64_t dim = 0, ffn_dim = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, vocab = 0, context_length = 0;
  double rope_theta = 10000;
  double rms_eps = 1e-5;
  DType dtype = DType::F32;  // the matrices' type: a float type or any GGUF block format
  // Empty, or a mixed recipe after llama.cpp's (q3_k_m, q4_k_m, q5_k_m): each matrix its own type
  // (synth_tensor_dtype); dtype is then the recipe's base type.
  std::string recipe;
  uint64_t seed = 0;
  bool tied_output = false;  // no output.weight: the head reads token_embd
};

// The architectures write_synthetic_model writes.
std::vector<std::string> synth_architectures();

// tiny, 110m, 110m-gqa, 1b. Throws Error listing the presets for an unknown name.
SynthSpec synth_preset(const std::string& name);
std::vector<std::string> synth_preset_names();

// Throws Error naming the field when the shape cannot make a model (e.g. heads not dividing dim).
void validate_synth_spec(const SynthSpec& spec);

// Weights in the file (embeddings, norms, linears); a double, as the fields' ranges allow more than
// an int64 counts.
double synth_parameter_count(const SynthSpec& spec);

// <unk>, <s>, </s>, the 256 byte tokens, then deterministic pieces until `size` entries
// (at least 260): types, scores (-rank) and special ids filled in as written to the file.
Vocabulary synth_vocabulary(int64_t size);

// The mixed recipes, their base type and llama_ftype (Error for an unknown name), and the type a
// matrix gets under the spec (its recipe's choice for `name`, its layer read from "blk.N.").
const std::vector<std::string>& synth_recipe_names();
DType synth_recipe_base(const std::string& recipe);
uint32_t synth_recipe_file_type(const std::string& recipe);
DType synth_tensor_dtype(const SynthSpec& spec, const std::string& name);

// Validates the spec and writes the model to path (streamed, one tensor at a time).
void write_synthetic_model(const SynthSpec& spec, const std::string& path);

}  // namespace tessera
