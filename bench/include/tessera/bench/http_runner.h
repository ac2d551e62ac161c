// Runs a trace against an OpenAI-compatible server over HTTP (`tessera bench --server URL`): each
// request is a streamed POST /v1/completions, sent on the workload's arrival process (Poisson: one
// thread per request at its arrival time; closed loop: N client threads), timed from the SSE chunks
// as they arrive.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/bench/runner.h"
#include "tessera/bench/trace.h"
#include "tessera/bench/workload.h"

namespace tessera {
class Tokenizer;
}

namespace tessera::bench {

struct ServerTarget {
  std::string url;      // http://host:port, optionally with a path prefix (a trailing /v1 is dropped)
  std::string api_key;  // sent as a bearer token when set
  std::string model;    // the request's `model`; empty = the first of GET /v1/models
  bool token_prompts = false;  // send the trace's token ids as the prompt instead of their text
};

struct HttpRunResult {
  // Per request, by trace index, on a clock that starts at the first send: submitted, first_token
  // (first chunk with text), token_times (one per chunk with text, not per token), finished, text,
  // reason, prompt (the trace's ids), cached_tokens (usage.prompt_tokens_details). `tokens` holds
  // usage.completion_tokens entries of -1: the count is the server's, the ids are not known.
  RunResult run;
  std::string model;             // the model name sent
  bool ignore_eos = false;       // the server accepted the ignore_eos extension
  int64_t prompt_token_mismatches = 0;  // usage.prompt_tokens differed from the trace's prompt length
  int64_t usage_missing = 0;     // finished requests without a usage block (output counted from text)
  // By trace index: the variant that served the request (a tessera deployment's X-Tessera-Variant
  // response header), "" where the answer had none.
  std::vector<std::string> variants;
  // From the server's Prometheus /metrics when it is a tessera server (null otherwise): KV blocks and
  // the prefix cache over the run (deltas of the counters scraped before and after).
  nlohmann::json server_metrics;
};

// Throws Error when the server cannot be reached or refuses the first (probe) request, naming the
// URL and the status or transport error; a request that fails alone is returned with reason error.
HttpRunResult run_trace_http(const ServerTarget& target, const Trace& trace, const Workload& workload,
                             const Tokenizer& tokenizer, const Progress& progress = {});

// Splits "http://host:port/prefix" into the scheme-host-port part and the path prefix (without a
// trailing "/" or "/v1"); throws Error for a URL that is not http(s)://host[:port][/path].
std::pair<std::string, std::string> split_server_url(const std::string& url);

// The value of an unlabelled Prometheus sample `name` in `text`; NaN when absent.
double prometheus_value(const std::string& text, const std::string& name);

}  // namespace tessera::bench
