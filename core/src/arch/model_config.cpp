// read_model_config: GGUF metadata -> ModelConfig, as the file's architecture description says.
#include <algorithm>
#include <cmath>
#include <string>

#include "architecture.h"
#include "tessera/error.h"
#include "tessera/gguf.h"
#include "tessera/model.h"

namespace tessera {

namespace {

// Each pair's inverse frequency under the file's RoPE scaling, as llama.cpp computes it (ggml's
// rope_yarn): base theta^(-2i/d) divided by rope_freqs.weight's factor; linear scaling multiplies it
// by 1/factor; YaRN mixes the scaled and unscaled frequency per pair by a ramp between the dims
// that turn beta_fast = 32 and beta_slow = 1 times over the original context, and scales cos/sin.
void read_rope_scaling(const GgufFile& file, const std::string& a, ModelConfig& c) {
  auto unsupported = [&](const std::string& what) {
    throw Error(file.path() + ": " + what + " is not supported (its outputs would differ from the model's)");
  };
  // llama.cpp's reading: type "linear" unless named; the factor from rope.scaling.factor, else
  // the older rope.scale_linear; "none" never scales.
  std::string type = "linear";
  if (file.find(a + "rope.scaling.type") != nullptr) type = file.get_string(a + "rope.scaling.type");
  double factor = file.get_float(a + "rope.scaling.factor", 0.0);
  if (factor == 0.0) factor = file.get_float(a + "rope.scale_linear", 0.0);
  if (type != "none" && type != "linear" && type != "yarn") {
    unsupported("RoPE scaling (" + a + "rope.scaling.type = " + type + "; supported: none, linear, yarn)");
  }
  if (!(factor >= 0) || !std::isfinite(factor) || (factor > 0 && factor < 1e-6)) {
    throw Error(file.path() + ": " + a + "rope.scaling.factor = " + std::to_string(factor) +
                " must be a positive finite number");
  }
  const double freq_scale = type == "none" || factor == 0.0 ? 1.0 : 1.0 / factor;
  const bool yarn = type == "yarn" && freq_scale != 1.0;
  const double attn_factor = file.get_float(a + "rope.scaling.attn_factor", 1.0);
  const GgufTensor* factors = file.find_tensor("rope_freqs.weight");
  if (freq_scale == 1.0 && factors == nullptr && attn_factor == 1.0) return;

  const int64_t half = c.rope_dim / 2;
  std::vector<float> ff(size_t(half), 1.0f);
  if (factors != nullptr) {
    if (factors->dtype != DType::F32 || factors->row_length() != half || factors->rows() != 1) {
      throw Error(file.path() + ": tensor 'rope_freqs.weight' must be F32 of " + std::to_string(half) +
                  " values (rope.dimension_count / 2)");
    }
    const auto* v = static_cast<const float*>(factors->data);
    for (int64_t i = 0; i < half; ++i) {
      if (!(v[i] > 0) || !std::isfinite(v[i])) {
        throw Error(file.path() + ": tensor 'rope_freqs.weight' value " + std::to_string(i) + " = " +
                    std::to_string(v[i]) + " must be positive and finite");
      }
      ff[size_t(i)] = v[i];
    }
  }
  double low = 0, high = 0;
  if (yarn) {
    const double n_ctx_orig = double(file.get_int(a + "rope.scaling.original_context_length", c.context_length));
    const double d = double(c.rope_dim), base = double(c.rope_theta);
    auto corr_dim = [&](double rotations) {
      return d * std::log(n_ctx_orig / (rotations * 2 * M_PI)) / (2 * std::log(base));
    };
    low = std::max(0.0, std::floor(corr_dim(32.0)));
    high = std::min(d - 1, std::ceil(corr_dim(1.0)));
  }
  c.rope_inv_freq.resize(size_t(half));
  for (int64_t i = 0; i < half; ++i) {
    const double extrap = std::pow(double(c.rope_theta), -2.0 * double(i) / double(c.rope_dim)) / ff[size_t(i)];
    double f = extrap * freq_scale;
    if (yarn) {
      const double y = (double(i) - low) / std::max(0.001, high - low);
      const double mix = 1.0 - std::min(1.0, std::max(0.0, y));
      f = f * (1 - mix) + extrap * mix;
    }
    c.rope_inv_freq[size_t(i)] = static_cast<float>(f);
  }
  c.rope_mscale = static_cast<float>(attn_factor * (yarn ? 1.0 + 0.1 * std::log(1.0 / freq_scale) : 1.0));
  c.rope_scaling = freq_scale != 1.0 ? type : factors != nullptr ? "freqs" : "attn_factor";
  if (freq_scale != 1.0 && factors != nullptr) c.rope_scaling += "+freqs";
}

}  // namespace

ModelConfig read_model_config(const GgufFile& file) {
  ModelConfig c;
  c.architecture = file.get_string("general.architecture");
  const Architecture* arch = find_architecture(c.architecture);
  if (arch == nullptr) {
    throw Error(file.path() + ": architecture '" + c.architecture + "' is not supported (supported: " +
                architecture_names() + ")");
  }
  const std::string a = c.architecture + ".";
  if (file.find("general.name") != nullptr) c.name = file.get_string("general.name");
  c.n_layers = file.get_int(a + "block_count");
  c.dim = file.get_int(a + "embedding_length");
  c.n_heads = file.get_int(a + "attention.head_count");
  c.n_kv_heads = file.get_int(a + "attention.head_count_kv", c.n_heads);
  c.ffn_dim = file.get_int(a + "feed_forward_length");
  c.context_length = file.get_int(a + "context_length");
  c.rms_eps = static_cast<float>(file.get_float(a + "attention.layer_norm_rms_epsilon", 1e-5));
  c.rope_theta = static_cast<float>(file.get_float(a + "rope.freq_base", 10000.0));
  auto positive = [&](const std::string& what, int64_t v) {
    if (v <= 0 || v > (int64_t(1) << 24)) {
      throw Error(file.path() + ": " + a + what + " = " + std::to_string(v) + " is out of range");
    }
  };
  positive("block_count", c.n_layers);
  positive("embedding_length", c.dim);
  positive("attention.head_count", c.n_heads);
  positive("attention.head_count_kv", c.n_kv_heads);
  positive("feed_forward_length", c.ffn_dim);
  positive("context_length", c.context_length);
  if (c.n_heads % c.n_kv_heads != 0) {
    throw Error(file.path() + ": head_count " + std::to_string(c.n_heads) + " is not a multiple of head_count_kv " +
                std::to_string(c.n_kv_heads));
  }
  // The head size: attention.key_length where given (Gemma, Qwen3, Mistral Nemo), else dim / heads.
  if (file.find(a + "attention.key_length") != nullptr) {
    c.head_dim = file.get_int(a + "attention.key_length");
    positive("attention.key_length", c.head_dim);
  } else if (c.dim % c.n_heads != 0) {
    throw Error(file.path() + ": embedding_length " + std::to_string(c.dim) + " is not a multiple of head_count " +
                std::to_string(c.n_heads) + " and no attention.key_length gives the head size");
  } else {
    c.head_dim = c.dim / c.n_heads;
  }
  if (const int64_t v = file.get_int(a + "attention.value_length", c.head_dim); v != c.head_dim) {
    throw Error(file.path() + ": " + a + "attention.value_length = " + std::to_string(v) +
                " is not supported (a value head size other than the key head size " + std::to_string(c.head_dim) +
                ")");
  }
  auto positive_finite = [&](const std::string& what, float v) {
    if (!(v > 0) || !std::isfinite(v)) {
      throw Error(file.path() + ": " + a + what + " = " + std::to_string(v) + " must be a positive finite number");
    }
  };
  positive_finite("attention.layer_norm_rms_epsilon", c.rms_eps);
  positive_finite("rope.freq_base", c.rope_theta);
  c.rope_dim = file.get_int(a + "rope.dimension_count", c.head_dim);
  if (c.rope_dim <= 0 || c.rope_dim > c.head_dim || c.rope_dim % 2 != 0) {
    throw Error(file.path() + ": rope.dimension_count " + std::to_string(c.rope_dim) +
                " must be even and at most the head size " + std::to_string(c.head_dim));
  }

  c.rope_style = arch->rope_style;
  c.activation = arch->activation;
  c.qkv_bias = arch->qkv_bias;
  c.fused_qkv = arch->fused_qkv;
  c.fused_gate_up = arch->fused_gate_up;
  c.qk_norm = arch->qk_norm;
  c.post_norms = arch->post_norms;
  if (arch->embed_scale) c.embed_scale = std::sqrt(static_cast<float>(c.dim));
  if (arch->attention_scale == AttentionScale::gemma_27b && c.n_layers == arch->gemma_27b_layers) {
    c.attn_scale = 1.0f / std::sqrt(static_cast<float>(c.dim / c.n_heads));
  }
  if (arch->softcaps) {
    c.attn_softcap = static_cast<float>(file.get_float(a + "attn_logit_softcapping", 50.0));
    c.final_softcap = static_cast<float>(file.get_float(a + "final_logit_softcapping", 30.0));
    for (const auto& [key, cap] : {std::pair{"attn_logit_softcapping", c.attn_softcap}, {"final_logit_softcapping", c.final_softcap}}) {
      if (cap != 0) positive_finite(key, cap);  // 0: no cap
    }
  }
  if (arch->window_layers != WindowLayers::ignored) {
    c.sliding_window = file.get_int(a + "attention.sliding_window", arch->default_window);
    if (c.sliding_window < 0) positive("attention.sliding_window", c.sliding_window);
  }
  if (arch->window_layers == WindowLayers::pattern && c.sliding_window > 0) {
    // Newer converters name the period (attention.sliding_window_pattern); the local layers' RoPE
    // base may be given too (rope.freq_base_swa).
    const int64_t period = file.get_int(a + "attention.sliding_window_pattern", arch->window_period);
    positive("attention.sliding_window_pattern", period);
    c.layer_slides.resize(size_t(c.n_layers));
    for (int64_t l = 0; l < c.n_layers; ++l) c.layer_slides[size_t(l)] = l % period < period - 1 ? 1 : 0;
    c.rope_theta_swa = static_cast<float>(file.get_float(a + "rope.freq_base_swa", arch->window_rope_base));
    if (c.rope_theta_swa != 0) positive_finite("rope.freq_base_swa", c.rope_theta_swa);
  }

  // Keys that change what the layers compute and that this engine does not implement: refused, as
  // ignoring them would give other logits than the model's without a word.
  auto unsupported = [&](const std::string& what) {
    throw Error(file.path() + ": " + what + " is not supported (its outputs would differ from the model's)");
  };
  read_rope_scaling(file, a, c);
  for (const char* t : {"rope_factors_long.weight", "rope_factors_short.weight"}) {
    if (file.find_tensor(t) != nullptr) unsupported(std::string("LongRoPE (tensor '") + t + "')");
  }

  const GgufTensor* emb = file.find_tensor("token_embd.weight");
  if (emb == nullptr) throw Error(file.path() + ": tensor 'token_embd.weight' is missing");
  c.vocab = emb->rows();
  c.tied_output = file.find_tensor("output.weight") == nullptr;
  // Blocks past block_count would be ignored: the file is not the model its keys describe.
  for (const GgufTensor& t : file.tensors()) {
    if (t.name.rfind("blk.", 0) != 0) continue;
    const int64_t block = std::atoll(t.name.c_str() + 4);
    if (block >= c.n_layers) {
      throw Error(file.path() + ": tensor '" + t.name + "' belongs to block " + std::to_string(block) + " but " + a +
                  "block_count is " + std::to_string(c.n_layers));
    }
  }
  return c;
}

AttentionShape attention_shape(const ModelConfig& c) {
  AttentionShape s;
  s.n_heads = c.n_heads;
  s.n_kv_heads = c.n_kv_heads;
  s.head_dim = c.head_dim;
  s.window = c.sliding_window;
  s.layer_slides = c.layer_slides;
  s.scale = c.attn_scale;
  s.softcap = c.attn_softcap;
  return s;
}

}  // namespace tessera
