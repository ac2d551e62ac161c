// A deployment file (YAML) for `tessera serve -d`: the models one server serves, each the OpenAI
// `model` name of one pipeline or of several weighted variants (a canary beside the stable one).
//
//   server: { port: 8080 }                       # optional: as a pipeline's server section
//   models:
//     - name: stories                            # what clients send as "model"
//       pipeline: pipelines/default.yaml         # relative: to the working directory, else to this file
//     - name: chat
//       variants:
//         - { name: stable, pipeline: pipelines/paged.yaml, weight: 95 }
//         - { name: canary, pipeline: pipelines/serve.yaml, weight: 5 }
//       rollback: { min_requests: 20, window: 60, max_error_rate: 0.05, max_ttft_p99_ratio: 2,
//                   max_perplexity_delta: 0.5, eval_text: eval.txt }
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/pipeline_spec.h"

namespace tessera {

struct VariantSpec {
  std::string name;  // "default" for a model given as one pipeline
  double weight = 1;  // share of the model's traffic, relative to its other variants (>= 0)
  PipelineSpec pipeline;
  std::string where;  // "file:line"
};

// The guard of a model's canaries: over the last `window` seconds, once a canary has finished
// min_requests requests, its error rate, and its P99 TTFT and TPOT against the stable variant's
// (when that has min_requests too), must stay within these; past one, the canary's weight drops to 0.
struct RollbackSpec {
  bool enabled = false;
  std::string stable;  // the variant the others are compared with: the first listed unless named
  int64_t min_requests = 20;
  double window = 60;               // seconds
  double max_error_rate = 0.05;     // share of requests that failed in the server
  double max_ttft_p99_ratio = 2.0;  // 0: not checked
  double max_tpot_p99_ratio = 2.0;  // 0: not checked
  // The accuracy gate, before a deployment takes traffic: every variant's perplexity on `eval_text`
  // (a file, resolved as pipelines are); a canary past the stable one's + this starts with weight 0.
  double max_perplexity_delta = 0;  // 0: not checked
  std::string eval_text;
  std::string where;
};

struct ModelSpec {
  std::string name;
  std::vector<VariantSpec> variants;
  RollbackSpec rollback;
  std::string where;
};

struct DeploymentSpec {
  std::string path;
  std::vector<ModelSpec> models;
  nlohmann::json server = nlohmann::json::object();  // as PipelineSpec::server
  std::map<std::string, std::string> server_where;
};

// Reads a deployment file and the pipelines it names; throws Error naming file:line (a pipeline's
// own errors are prefixed with the deployment line that names it).
DeploymentSpec load_deployment_spec(const std::string& path);
// One pipeline as a one-model deployment (`tessera serve -p`): its server section, model `name`.
DeploymentSpec single_pipeline_deployment(PipelineSpec pipeline, const std::string& name);
// Whether `name` can name a model or variant: 1..64 of [A-Za-z0-9._:/-] (it travels in headers,
// metric labels and logs unescaped).
bool valid_deployment_name(const std::string& name);

}  // namespace tessera
