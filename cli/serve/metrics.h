// Server metrics in the Prometheus text format (version 0.0.4): requests by route and status, tokens
// in and out, time-to-first-token and inter-token histograms, queue depth, KV blocks, prefix hit rate
// — globally and per user (the request's `user` field). Users beyond kMaxUsers share the label
// "_other", so a client inventing user names cannot grow the page without bound. With several models
// or variants (a deployment), the unlabelled series are the server's totals and the tessera_variant_*
// series give each variant's share, labelled model="..",variant="..".
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "serving_engine.h"

namespace tessera::serve {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void observe(double v);
  // Appends NAME_bucket{labels,le=...}, NAME_sum and NAME_count.
  void write(std::string& out, const std::string& name, const std::string& labels) const;

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // per bucket (not cumulative); last = +Inf
  double sum_ = 0;
  int64_t count_ = 0;
};

// One variant's engine as /metrics reports it.
struct VariantSnapshot {
  std::string model, variant;
  double weight = 1;
  EngineSnapshot snapshot;
  bool speculates = false;
  std::map<std::string, int64_t> rollbacks;  // by reason
  size_t weight_bytes = 0;  // the weights it runs on (shared ones count for each variant sharing them)
};

class ServerMetrics {
 public:
  static constexpr size_t kMaxUsers = 100;  // as many as the prefix cache reports (its other users are "_other" too)

  ServerMetrics();
  // Every HTTP response, by route ("unmatched" for unknown paths) and status.
  void count_http(const std::string& route, int status);
  // A generation request's outcome for its user ("" = the request named none or was not parsed;
  // 499 = the client went away mid-stream).
  void count_user(const std::string& user, int status);
  // A generation request with a constraint (structured output), by its kind: json_object,
  // json_schema, grammar, regex, choice or tools (tool_choice required or named).
  void count_constrained(const std::string& kind);
  // A reload of the deployment that took effect.
  void count_reload();
  // A finished generation by a model's variant: tokens in/out and its latencies (seconds on the
  // engine clock).
  void observe(const std::string& user, const std::string& model, const std::string& variant,
               const GenerationResult& result);
  // The whole page; draft metrics where a variant's pipeline speculates.
  std::string render(const std::vector<VariantSnapshot>& variants, int64_t http_in_flight) const;

 private:
  struct Series {
    std::map<int, int64_t> requests;  // by status (per user only: routes count the total)
    int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
    Histogram ttft, itl;
    Series();
  };
  Series& user_series(const std::string& user);
  void write_variants(std::string& out, const std::vector<VariantSnapshot>& variants) const;

  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, int64_t> requests_;  // (route, status)
  std::map<std::string, int64_t> constrained_;  // by kind
  int64_t reloads_ = 0;
  Series global_;
  std::map<std::string, Series> users_;
  std::map<std::pair<std::string, std::string>, Series> variants_;  // by (model, variant): a deployment's few
};

// Prometheus label value escaping (backslash, quote, newline).
std::string prom_escape(const std::string& value);

}  // namespace tessera::serve
