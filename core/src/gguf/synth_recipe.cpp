// Per-tensor types of synthetic models written with a mixed recipe (SynthSpec::recipe), after
// llama.cpp's _M ftypes: most matrices in the base k-quant, the ones quantization hurts most in
// more bits — output in Q6_K, attn_v and ffn_down in Q6_K (Q4_K_M, Q5_K_M) on the layers
// use_more_bits picks (the first and last eighth, and every third between), Q3_K_M's attn_v on its
// first two layers and ffn_down on its first sixteenth in Q5_K, its attn_output in Q4_K.
#include <string>

#include "tessera/error.h"
#include "tessera/synth.h"

namespace tessera {

namespace {

bool use_more_bits(int64_t layer, int64_t layers) {
  return layer < layers / 8 || layer >= 7 * layers / 8 || (layer - layers / 8) % 3 == 2;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

const std::vector<std::string>& synth_recipe_names() {
  static const std::vector<std::string> names = {"q3_k_m", "q4_k_m", "q5_k_m"};
  return names;
}

DType synth_recipe_base(const std::string& recipe) {
  if (recipe == "q3_k_m") return DType::Q3_K;
  if (recipe == "q4_k_m") return DType::Q4_K;
  if (recipe == "q5_k_m") return DType::Q5_K;
  throw Error("synth: recipe '" + recipe + "' is not known (q3_k_m, q4_k_m, q5_k_m)");
}

uint32_t synth_recipe_file_type(const std::string& recipe) {
  synth_recipe_base(recipe);  // validates
  return recipe == "q3_k_m" ? 12 : recipe == "q4_k_m" ? 15 : 17;  // llama_ftype MOSTLY_Q*_K_M
}

DType synth_tensor_dtype(const SynthSpec& s, const std::string& name) {
  if (s.recipe.empty()) return s.dtype;
  const int64_t layer = name.rfind("blk.", 0) == 0 ? std::stoll(name.substr(4)) : -1;
  const DType base = synth_recipe_base(s.recipe);
  if (name == "output.weight") return DType::Q6_K;
  // Architectures with a fused attn_qkv take attn_v's choice for it.
  const bool v = ends_with(name, "attn_v.weight") || ends_with(name, "attn_qkv.weight");
  const bool down = ends_with(name, "ffn_down.weight");
  if (base == DType::Q3_K) {
    if (v) return layer < 2 ? DType::Q5_K : DType::Q4_K;
    if (down) return layer < s.n_layers / 16 ? DType::Q5_K : use_more_bits(layer, s.n_layers) ? DType::Q4_K : base;
    if (ends_with(name, "attn_output.weight")) return DType::Q4_K;
    return base;
  }
  if ((v || down) && use_more_bits(layer, s.n_layers)) return DType::Q6_K;
  return base;
}

}  // namespace tessera
