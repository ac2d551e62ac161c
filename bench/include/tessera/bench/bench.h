// `tessera bench`: every pipeline on the identical request trace, one after the other, then the
// accuracy of each against the first, and the report (JSON, Markdown, HTML) in one folder.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tessera {
class Registry;
}

namespace tessera::bench {

struct BenchOptions {
  std::vector<std::string> pipelines;  // YAML files; the first is the reference
  // OpenAI-compatible servers, columns after the pipelines (the first is the reference when there
  // are no pipelines). Their prompts are the trace's ids decoded with the tokenizer of the first
  // pipeline, or of `trace_pipeline` (with -m) when there are none.
  std::vector<std::string> servers;
  std::string api_key;
  std::string server_model;        // the `model` field; empty = the server's first model
  bool server_token_prompts = false;  // send token ids instead of text
  std::string trace_pipeline;      // pipeline YAML for the tokenizer when only servers are given
  std::string workload;                // YAML file
  std::string out_dir;
  std::string model;    // -m: overrides every pipeline's model
  std::string backend;  // overrides every pipeline's backend
  std::string kv_dtype;  // overrides every pipeline's KV cache type
  int threads = 0;      // CPU threads; 0 = the backend's default
  bool accuracy = true;
  std::string accuracy_text;       // perplexity text; default: the workload's prompt file
  int64_t accuracy_ctx = 128;      // perplexity chunk length
  int64_t accuracy_chunks = 8;     // chunks scored at most
  int64_t accuracy_prompts = 8;    // trace prompts for greedy agreement
  int64_t accuracy_tokens = 32;    // tokens generated per prompt
  double probe_seconds = 0.25;     // per machine probe (bandwidth, FMA)
  bool progress = true;            // progress on stderr
  std::string command;             // the command line, for the reproduce line
};

struct BenchOutcome {
  nlohmann::json report;
  std::vector<std::string> files;  // written
  int ran = 0;
  int failed = 0;
};

// Throws Error for a bad workload, a trace that cannot fit the model, or an unwritable folder; a
// pipeline that fails to load or run is recorded in the report and the others go on.
BenchOutcome run_bench(const BenchOptions& options, const Registry& registry, std::ostream& log);

// The machine and build: CPU, cores, memory, build type, git commit, measured bandwidth and FMA peak.
nlohmann::json machine_conditions(double probe_seconds);

}  // namespace tessera::bench
