// A built pipeline: the backend, the model on it, the tokenizer and one component of each kind,
// created through the registry from a PipelineSpec.
#pragma once

#include <memory>
#include <string>

#include "tessera/constraint.h"
#include "tessera/gguf.h"
#include "tessera/model.h"
#include "tessera/model_share.h"
#include "tessera/pipeline_spec.h"
#include "tessera/registry.h"
#include "tessera/tokenizer.h"

namespace tessera {

struct PipelineOptions {
  std::string model;    // overrides the pipeline's model when set (-m)
  std::string model_flag = "-m";  // the option that gave `model`, named in its errors
  std::string backend;  // overrides the pipeline's backend when set
  std::string kv_dtype;  // overrides the pipeline's kv_dtype when set (--kv-dtype)
  int threads = 0;      // CPU threads; 0 = the backend's default
  // Where set, a pipeline whose model file, backend (its parameters and threads) and quantizer (its
  // parameters) match one already loaded there shares that one's weights (tessera/model_share.h).
  ModelShare* share = nullptr;
};

class Pipeline {
 public:
  // Validates the spec (plugins, parameters, backend ops) and loads the model; throws Error.
  static std::unique_ptr<Pipeline> build(const PipelineSpec& spec, const Registry& registry,
                                         const PipelineOptions& options = {});
  ~Pipeline();

  const PipelineSpec& spec() const { return spec_; }
  // The most tokens (prompt and generated) one sequence may hold: the model's context, or less
  // where the cache holds fewer per sequence (a contiguous cache's max_len).
  int64_t max_sequence_tokens() const { return max_sequence_tokens_; }
  // What sets that bound, for messages: "the model's context of N tokens" or "the contiguous
  // cache's N tokens per sequence".
  std::string sequence_limit_text() const;
  const std::string& model_path() const { return model_path_; }
  Backend& backend() { return *loaded_->backend; }
  Model& model() { return *loaded_->model; }
  const Model& model() const { return *loaded_->model; }
  // Held while the model runs: pipelines sharing weights take turns (PipelineOptions::share).
  std::mutex& step_mutex() { return loaded_->step_mutex; }
  // Whether `other` runs on the same weights (one load, shared).
  bool shares_weights_with(const Pipeline& other) const { return loaded_ == other.loaded_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  Quantizer& quantizer() { return *loaded_->quantizer; }
  Attention& attention() { return *attention_; }
  Cache& cache() { return *cache_; }
  Scheduler& scheduler() { return *scheduler_; }
  Decoder& decoder() { return *decoder_; }
  Communicator& comm() { return *loaded_->comm; }
  // Under tensor parallelism, on every rank but 0: runs the model's share of the steps rank 0 sends
  // until rank 0's pipeline goes, then returns true. False at once on rank 0 (and in one process),
  // which goes on to run the engine. Every command that builds a pipeline calls it next.
  bool follow();
  // Compiles request constraints (JSON Schema, grammars) against this model's vocabulary.
  const Constraint& constraint() const { return *constraint_; }
  // "cpu | none gqa contiguous fcfs sampling"
  std::string describe() const;

 private:
  Pipeline() = default;
  PipelineSpec spec_;
  std::string model_path_;
  int64_t max_sequence_tokens_ = 0;
  // Declaration order is destruction order reversed: components that hold backend memory or
  // objects made by a plugin go before the backend (in loaded_) and that plugin.
  std::shared_ptr<LoadedModel> loaded_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::shared_ptr<Attention> attention_;
  std::shared_ptr<Cache> cache_;
  std::shared_ptr<Scheduler> scheduler_;
  std::shared_ptr<Decoder> decoder_;
  std::shared_ptr<Constraint> constraint_;
};

}  // namespace tessera
