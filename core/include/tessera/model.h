// The Llama-family model: embeddings, RMSNorm, RoPE, attention (GQA/MQA/MHA), SwiGLU and the
// output head, run over a ragged batch on a backend. It calls the Quantizer (for every linear),
// the Attention and the Cache through their interfaces, never a concrete plugin.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tessera/attention.h"
#include "tessera/backend.h"
#include "tessera/cache.h"
#include "tessera/device_buffer.h"
#include "tessera/gguf.h"
#include "tessera/quantizer.h"

namespace tessera {

struct ModelConfig {
  std::string architecture;
  std::string name;
  int64_t n_layers = 0;
  int64_t dim = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t ffn_dim = 0;
  int64_t vocab = 0;
  int64_t context_length = 0;
  int64_t rope_dim = 0;
  float rope_theta = 10000.0f;
  RopeStyle rope_style = RopeStyle::adjacent;
  float rms_eps = 1e-5f;
  int64_t sliding_window = 0;
  bool tied_output = false;
};

// Reads the architecture from GGUF metadata; throws Error naming the missing or bad key.
ModelConfig read_model_config(const GgufFile& file);

// One sequence's part of a step: `tokens` at positions start_pos..; logits are returned for its
// last `logit_rows` tokens (1 for generation, all for perplexity, k+1 for speculative checks).
struct ForwardSeq {
  SeqId seq = 0;
  std::span<const int32_t> tokens;
  int64_t start_pos = 0;
  int64_t logit_rows = 1;
  // Its tokens verify speculative drafts: each one's output must be what a one-token decode step
  // gives (AttentionStep::host_verifies).
  bool verifies = false;
};

class Model {
 public:
  Model(std::shared_ptr<const GgufFile> file, Backend& backend, Quantizer& quantizer);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return config_; }
  // Backend memory held by weights (embeddings, norms, linears).
  size_t weight_bytes() const { return weight_bytes_; }
  // What one token costs in weights, for roofline figures: the bytes a decode step reads per
  // sequence (every linear and norm, one embedding row), and the multiply-adds of the layers'
  // linears per token (the output head, run only for rows whose logits are wanted, apart).
  size_t decode_bytes_per_token() const { return decode_bytes_per_token_; }
  int64_t layer_macs_per_token() const { return layer_macs_per_token_; }
  int64_t head_macs() const { return config_.vocab * config_.dim; }
  // A short description of the weight formats, e.g. "f32 x 36" or "q8_0 x 35, f32 x 1".
  std::string weight_formats() const;
  // Each linear's format (Linear::format()), in load order: "int4/g32/asym", "f32 (fallback: ...)".
  const std::vector<std::string>& linear_formats() const { return formats_; }
  // Whether one of linear_formats() keeps the weight in floating point (f32, f16 or bf16: kept,
  // fallen back, or never quantized).
  static bool is_float_format(const std::string& format);
  // The names of the weights offered to the quantizer, in load order ("output.weight" also when
  // the head is tied to token_embd): what its tensor patterns (keep_float ...) are matched against.
  const std::vector<std::string>& linear_names() const { return linear_names_; }
  std::vector<OpRequirement> requirements() const;

  // Runs one step; the cache must already hold blocks for every token. Writes logits rows in batch
  // order to `logits` (host memory, resized to rows * vocab). `n_layers` > 0 runs only the first
  // n_layers blocks before the output head (a layer-skip draft of the same model; its KV is written
  // for those layers only).
  void forward(std::span<const ForwardSeq> batch, Attention& attention, Cache& cache,
               std::vector<float>& logits, int64_t n_layers = 0);
  // Whether a one-token step on two or more host threads runs each layer in one parallel region,
  // its GEMVs dealt out by rows (the backend takes every layer's weights for Backend::gemv_share),
  // instead of a region per op.
  bool decodes_in_layer_regions() const { return layers_share_gemvs_; }

 private:
  struct Layer;  // model_parts.h
  void upload_step(std::span<const ForwardSeq> batch, Cache& cache);
  // One token's layers with each GEMV shared out over the host thread team inside a region that
  // spans from one attention to the next (Backend::gemv_share), where the backend takes every
  // Linear of the layers; false, with nothing run, otherwise.
  bool decode_in_few_regions(const AttentionStep& step, Attention& attention, Cache& cache, int64_t layers);
  // Whether the backend takes every layer's GEMVs for gemv_share (and each Linear runs as gemm).
  bool layers_share_gemvs() const;

  std::shared_ptr<const GgufFile> file_;
  Backend& backend_;
  ModelConfig config_;
  WeightView embedding_;
  DeviceBuffer embedding_buffer_;
  DeviceBuffer output_norm_;
  std::unique_ptr<Linear> output_;
  std::vector<Layer> layers_;
  size_t weight_bytes_ = 0;
  size_t decode_bytes_per_token_ = 0;
  int64_t layer_macs_per_token_ = 0;
  std::vector<std::string> formats_;
  std::vector<std::string> linear_names_;
  bool any_fused_ = false;  // some layer runs q|k|v or gate|up as one Linear
  bool layers_share_gemvs_ = false;

  // Per-step scratch, grown on demand.
  struct Scratch;
  std::unique_ptr<Scratch> scratch_;
};

}  // namespace tessera
