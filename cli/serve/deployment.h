// What one server serves (a DeploymentSpec built): models, each with one or more weighted variants,
// each variant a pipeline with its own serving engine and chat template. A request's `model` picks
// the model; the variant is drawn by weight, sticky per user (the same user lands on the same variant
// while the weights stay), at random for anonymous requests.
#pragma once

#include <atomic>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "chat_template.h"
#include "rollback_guard.h"
#include "serving_engine.h"
#include "tessera/deployment_spec.h"
#include "tessera/pipeline.h"

namespace tessera::serve {

struct ModelGuard;

struct Variant {
  std::string model;  // the model's name
  std::string name;
  std::atomic<double> weight{1};
  std::string pipeline_path;  // the file it was built from
  std::unique_ptr<Pipeline> pipeline;
  std::unique_ptr<ServingEngine> engine;
  ChatTemplate chat{ChatFormat::fallback};  // replaced by the chosen one
  size_t index = 0;  // in its model's variants
  ModelGuard* guard = nullptr;  // its model's
  double perplexity = std::numeric_limits<double>::quiet_NaN();  // on the rollback's eval_text, where set
};

// A model's canary guard: the variants' recent outcomes and the rollbacks so far.
struct ModelGuard {
  RollbackSpec spec;
  size_t stable = 0;  // the variant canaries are compared with
  mutable std::mutex mutex;
  std::vector<OutcomeWindow> windows;                     // per variant
  std::vector<std::map<std::string, int64_t>> rollbacks;       // per variant, by reason
};

struct ServedModel {
  std::string name;
  std::vector<std::unique_ptr<Variant>> variants;
  std::unique_ptr<ModelGuard> guard;
};

class Deployment {
 public:
  // `build` makes each variant's pipeline (the CLI's overrides applied); `chat_setting` is the
  // server's chat_template setting, applied to each variant's GGUF.
  using PipelineBuilder = std::function<std::unique_ptr<Pipeline>(const PipelineSpec&)>;
  Deployment(const DeploymentSpec& spec, const PipelineBuilder& build, const std::string& chat_setting);
  ~Deployment();

  const std::vector<ServedModel>& models() const { return models_; }
  const std::string& path() const { return path_; }  // the deployment (or pipeline) file
  // The model named `name` ("" = the first one), or nullptr.
  const ServedModel* find(const std::string& name) const;
  // The variant that serves `user` (empty: anonymous, a random draw).
  Variant& route(const ServedModel& model, const std::string& user) const;
  // "model 'a', model 'b' (variants x 90%, y 10%)": for the start-up line and error messages.
  std::string describe() const;
  std::string names() const;  // "'a', 'b'"

  // A request `v` finished: its outcome joins the window, and a canary past its model's rollback
  // limits loses its traffic at once (weight 0; requests in flight finish), logged with the figures.
  void record(Variant& v, const GenerationResult& result);
  // Rollbacks of a variant so far, by reason (error_rate, ttft_p99, tpot_p99, perplexity).
  std::map<std::string, int64_t> rollbacks(const Variant& v) const;

  // The other variants ("model/variant") that run on the same loaded weights as `v`.
  std::vector<std::string> weight_sharers(const Variant& v) const;

  // Every variant's engine.
  void cancel_all();
  void stop();
  std::string failure() const;  // the first failed engine's message, "" when none

 private:
  // max_perplexity_delta: every variant scored on eval_text; a canary past it starts at weight 0.
  void check_perplexity(ServedModel& m);
  std::string path_;
  std::vector<ServedModel> models_;
};

}  // namespace tessera::serve
