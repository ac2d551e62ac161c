// The benchmark report. Runs are turned into one JSON document (schema: docs/bench_schema.md);
// the Markdown and HTML files are rendered from that JSON alone, so the three always agree.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/bench/runner.h"
#include "tessera/bench/trace.h"
#include "tessera/bench/workload.h"
#include "tessera/model.h"

namespace tessera::bench {

// One pipeline's part of a bench: what was built and how its run went.
struct PipelineRun {
  std::string name;  // the file's stem: "baseline", "paged"
  std::string file;
  std::string error;  // set when the pipeline failed
  std::string failed_stage;  // "load", "run" (or "accuracy", which keeps the run's figures)
  std::string describe;
  std::string backend;
  std::string device;  // the backend's first device as it names itself (for the CPU: model and ISA)
  std::string model_path;
  std::string weight_formats;
  // How a one-token step runs on the host: "per layer" (Model::decodes_in_layer_regions), "per op".
  std::string decode_regions;
  ModelConfig model;
  size_t weight_bytes = 0;
  bool greedy = false;  // the decoder's default is greedy: outputs can be compared token by token
  double build_seconds = 0;
  size_t peak_rss = 0;
  bool peak_rss_per_pipeline = false;  // the peak was reset before this pipeline was built
  RunResult run;
  nlohmann::json accuracy = nlohmann::json::object();  // eval-path figures (filled by the caller)
  // A column run over HTTP (`--server URL`): the URL, and what only HTTP runs have. Output token
  // ids are unknown there (tokens hold -1s), so agreement is by text.
  std::string server;
  std::string served_model;
  bool ignore_eos = false;
  int64_t prompt_token_mismatches = 0;
  int64_t usage_missing = 0;
  nlohmann::json server_metrics;  // from a tessera server's /metrics, else null
  std::vector<std::string> variants;  // per request, the deployment variant that served it ("" = unknown)
  bool ok() const { return error.empty() || failed_stage == "accuracy"; }
};

// The figures of one pipeline: latency summaries, throughput, memory, prefix reuse, breakdowns per
// class and user, CDF points and TTFT against load. `reference` (may be null or the run itself)
// gives the trace agreement.
nlohmann::json pipeline_metrics(const PipelineRun& run, const PipelineRun* reference, const Trace& trace,
                                const Workload& workload, const nlohmann::json& machine);

// Ratios of `metrics` to `reference` metrics (latency: lower is better; throughput: higher is).
nlohmann::json ratios(const nlohmann::json& metrics, const nlohmann::json& reference);

// The whole report: {"schema", "workload", "conditions", "reference", "pipelines", "five_questions"}.
nlohmann::json make_report(const std::vector<PipelineRun>& runs, const Trace& trace, const Workload& workload,
                           const nlohmann::json& conditions);

std::string render_markdown(const nlohmann::json& report);
std::string render_html(const nlohmann::json& report);

// The workload as the report's conditions state it (classes with their length distributions,
// arrival, users, system prompt, seed, trace fingerprint).
nlohmann::json workload_json(const Workload& w, const Trace& trace);

}  // namespace tessera::bench
