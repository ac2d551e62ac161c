// The decoder-only transformer: embeddings, RMSNorm, RoPE, attention (GQA/MQA/MHA), a gated FFN and
// the output head, run over a ragged batch on a backend. What differs between architectures (llama,
// qwen2/3, phi3, gemma 1-3: biases, q/k norms, fused tensors, soft-caps, post-norms, window
// patterns, RoPE variants) is data in ModelConfig, read from the GGUF as each architecture's
// description (core/src/arch/) says. It calls the Quantizer (for every linear), the Attention and the
// Cache through their interfaces, never a concrete plugin.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tessera/attention.h"
#include "tessera/backend.h"
#include "tessera/cache.h"
#include "tessera/communicator.h"
#include "tessera/device_buffer.h"
#include "tessera/gguf.h"
#include "tessera/quantizer.h"

namespace tessera {

enum class FfnActivation : uint8_t {
  silu,       // SwiGLU: silu(gate) * up
  gelu_tanh,  // GeGLU: gelu(gate) * up, GELU's tanh approximation (Gemma)
};

struct ModelConfig {
  std::string architecture;
  std::string name;
  int64_t n_layers = 0;
  int64_t dim = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;  // attention.key_length, else dim / n_heads
  int64_t ffn_dim = 0;
  int64_t vocab = 0;
  int64_t context_length = 0;
  int64_t rope_dim = 0;
  float rope_theta = 10000.0f;
  RopeStyle rope_style = RopeStyle::adjacent;
  float rms_eps = 1e-5f;
  int64_t sliding_window = 0;
  bool tied_output = false;

  int64_t q_dim() const { return n_heads * head_dim; }
  int64_t kv_dim() const { return n_kv_heads * head_dim; }
  FfnActivation activation = FfnActivation::silu;
  bool qkv_bias = false;       // blk.N.attn_{q,k,v}.bias required (qwen2); elsewhere loaded where present
  bool fused_qkv = false;      // blk.N.attn_qkv.weight holds q, k and v (phi3)
  bool fused_gate_up = false;  // blk.N.ffn_up.weight holds gate then up (phi3)
  bool qk_norm = false;        // blk.N.attn_{q,k}_norm.weight: RMSNorm per head before RoPE (qwen3, gemma3)
  bool post_norms = false;     // blk.N.post_attention_norm / post_ffw_norm on each sublayer's output (gemma2/3)
  float embed_scale = 0.0f;    // embeddings multiplied by it (gemma: sqrt(dim)); 0 = none
  float attn_scale = 0.0f;     // attention score scale; 0 = 1/sqrt(head_dim)
  float attn_softcap = 0.0f;   // attention logit soft cap (gemma2); 0 = none
  float final_softcap = 0.0f;  // output logits: cap * tanh(logit / cap) (gemma2); 0 = none
  // Per layer, 1 where sliding_window applies; empty: every layer (where sliding_window > 0).
  std::vector<uint8_t> layer_slides;
  float rope_theta_swa = 0.0f;  // RoPE base of sliding layers (gemma3: 10000); 0 = rope_theta
  // RoPE scaling ("linear", "yarn") or per-pair factors ("freqs", rope_freqs.weight): each pair's
  // inverse frequency, and the magnitude on cos/sin (YaRN). Empty: theta^(-2i/rope_dim), unscaled.
  std::string rope_scaling = "none";
  std::vector<float> rope_inv_freq;
  float rope_mscale = 1.0f;
};

// The attention shape a model's layers need (heads, window pattern, scale, soft cap).
AttentionShape attention_shape(const ModelConfig& c);

// The general.architecture values read_model_config accepts.
std::vector<std::string> supported_architectures();

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

// Tensor parallelism (a communicator of N > 1 ranks): each rank holds 1/N of every layer as
// Megatron-LM splits it (q/k/v and gate/up by output rows, o and down by input columns, an
// all-reduce after each; KV heads divided) and 1/N of the output head's vocabulary rows (logits
// gathered on rank 0). Rank 0 runs the engine: forward() sends each step (token ids, positions,
// block tables) to the other ranks, which run it in follow().
class Model {
 public:
  // `comm` (may be null: one process) outlives the model.
  Model(std::shared_ptr<const GgufFile> file, Backend& backend, Quantizer& quantizer, Communicator* comm = nullptr);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // This rank's shard under tensor parallelism: n_heads, n_kv_heads and ffn_dim divided by the ranks.
  const ModelConfig& config() const { return config_; }
  int tensor_ranks() const { return ranks_; }
  // On a rank other than 0: runs the steps rank 0's forward() sends until its model is destroyed.
  void follow(Attention& attention, Cache& cache);
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
  using Tables = std::vector<std::span<const int32_t>>;  // each sequence's block table, in batch order
  void run(std::span<const ForwardSeq> batch, const Tables& tables, Attention& attention, Cache& cache,
           std::vector<float>& logits, int64_t layers);
  void upload_step(std::span<const ForwardSeq> batch, const Tables& tables, int64_t block_size);
  // Tensor parallelism (model_shard.cpp): a weight's rows (parts: the row counts of tensors stored
  // as one, each split alike) or columns that are this rank's, and the step's traffic.
  WeightSource shard_rows(const WeightSource& w, std::span<const int64_t> parts);
  WeightSource shard_cols(const WeightSource& w);
  void all_reduce(float* x, int64_t n);
  void send_step(std::span<const ForwardSeq> batch, const Tables& tables, int64_t layers);
  void gather_logits(const float* mine, int64_t rows, std::vector<float>& logits);
  // A layer's q, k (and v) between projection and attention: biases, q/k norms, RoPE.
  void attention_inputs(const Layer& L, float* q, float* k, float* v, const int32_t* positions, int64_t rows);
  void rope(int64_t layer, float* q, float* k, const int32_t* positions, int64_t rows);
  void activate(const float* gate, const float* up, float* out, int64_t n);  // the FFN's gate activation
  // One token's layers with each GEMV shared out over the host thread team inside a region that
  // spans from one attention to the next (Backend::gemv_share), where the backend takes every
  // Linear of the layers; false, with nothing run, otherwise.
  bool decode_in_few_regions(AttentionStep& step, Attention& attention, Cache& cache, int64_t layers);
  // Whether the backend takes every layer's GEMVs for gemv_share (and each Linear runs as gemm).
  bool layers_share_gemvs() const;

  std::shared_ptr<const GgufFile> file_;
  Backend& backend_;
  Communicator* comm_ = nullptr;
  int rank_ = 0, ranks_ = 1;
  int64_t vocab_begin_ = 0, vocab_end_ = 0;  // this rank's rows of the output head
  // Copies of weight shards that are not one run of the file (columns, parts of fused tensors):
  // declared before the Linears made from them, so they outlive them.
  std::vector<std::shared_ptr<uint8_t[]>> shard_copies_;
  std::vector<float> host_stage_;  // an all-reduce's data on a backend whose buffers are on a device
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
  bool plain_layers_ = true;  // no layer has biases
  DeviceBuffer rope_freqs_;   // ModelConfig::rope_inv_freq on the backend (empty: unscaled RoPE)
  bool layers_share_gemvs_ = false;

  // Per-step scratch, grown on demand.
  struct Scratch;
  std::unique_ptr<Scratch> scratch_;
};

}  // namespace tessera
