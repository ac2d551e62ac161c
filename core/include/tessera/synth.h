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
  int64_t dim = 0, ffn_dim = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, vocab = 0, context_length = 0;
  double rope_theta = 10000;
  double rms_eps = 1e-5;
  DType dtype = DType::F32;  // F32, F16, BF16, Q8_0 or Q4_0
  uint64_t seed = 0;
  bool tied_output = false;  // no output.weight: the head reads token_embd
};

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

// Validates the spec and writes the model to path (streamed, one tensor at a time).
void write_synthetic_model(const SynthSpec& spec, const std::string& path);

}  // namespace tessera
