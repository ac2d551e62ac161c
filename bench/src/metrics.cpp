// Per-pipeline figures from one run's per-request timings.
#include <algorithm>
#include <map>

#include "tessera/bench/report.h"
#include "tessera/bench/stats.h"

namespace tessera::bench {

namespace {

using nlohmann::json;

struct Samples {
  std::vector<double> ttft, tpot, itl, e2e, queue;
  int64_t count = 0, errors = 0, output_tokens = 0, prompt_tokens = 0, cached_tokens = 0;

  void add(const GenerationResult& r) {
    ++count;
    if (r.reason == FinishReason::error) {
      ++errors;
      return;
    }
    prompt_tokens += int64_t(r.prompt.size());
    cached_tokens += r.cached_tokens;
    output_tokens += int64_t(r.tokens.size());
    e2e.push_back(r.finished - r.submitted);
    if (r.admitted > 0) queue.push_back(r.admitted - r.submitted);
    if (r.tokens.empty()) return;
    ttft.push_back(r.ttft());
    // Over HTTP token_times has one entry per SSE chunk, which may carry several tokens: TPOT divides
    // by the token count either way, and ITL is then the gap between chunks.
    if (r.tokens.size() >= 2 && !r.token_times.empty()) {
      tpot.push_back((r.token_times.back() - r.first_token) / double(r.tokens.size() - 1));
    }
    for (double gap : r.inter_token_times()) itl.push_back(gap);
  }

  json latency_json() const {
    return {{"ttft", summary_json(summarize(ttft), 1000)}, {"tpot", summary_json(summarize(tpot), 1000)},
            {"itl", summary_json(summarize(itl), 1000)},   {"e2e", summary_json(summarize(e2e), 1000)},
            {"queue", summary_json(summarize(queue), 1000)}};
  }
  json prefix_share() const {
    return prompt_tokens > 0 ? json(double(cached_tokens) / double(prompt_tokens)) : json(nullptr);
  }
};

json cdf_json(const std::vector<double>& seconds) {
  json out = json::array();
  for (const auto& [x, y] : cdf_points(seconds)) out.push_back({x * 1000, y});
  return out;
}

// How many other requests were in the system (submitted, not finished) when each one arrived.
std::vector<int64_t> in_flight_at_arrival(const std::vector<GenerationResult>& results) {
  std::vector<double> sub, fin;
  for (const auto& r : results) {
    sub.push_back(r.submitted);
    fin.push_back(r.finished);
  }
  std::sort(sub.begin(), sub.end());
  std::sort(fin.begin(), fin.end());
  std::vector<int64_t> out;
  for (const auto& r : results) {
    const auto submitted = std::upper_bound(sub.begin(), sub.end(), r.submitted) - sub.begin();
    const auto finished = std::upper_bound(fin.begin(), fin.end(), r.submitted) - fin.begin();
    out.push_back(std::max<int64_t>(0, int64_t(submitted - finished) - 1));
  }
  return out;
}

// TTFT grouped by the load a request met on arrival, in at most 12 bins of equal width.
json ttft_by_load(const std::vector<GenerationResult>& results) {
  const std::vector<int64_t> load = in_flight_at_arrival(results);
  json out = json::array();
  if (load.empty()) return out;
  const int64_t hi = *std::max_element(load.begin(), load.end());
  const int64_t width = std::max<int64_t>(1, (hi + 12) / 12);
  std::map<int64_t, std::vector<double>> bins;
  for (size_t i = 0; i < results.size(); ++i) {
    if (results[i].reason == FinishReason::error || results[i].tokens.empty()) continue;
    bins[load[i] / width].push_back(results[i].ttft());
  }
  for (const auto& [bin, ttft] : bins) {
    const Summary s = summarize(ttft);
    out.push_back({{"in_flight_min", bin * width}, {"in_flight_max", bin * width + width - 1}, {"count", s.count},
                   {"ttft_mean_ms", s.mean * 1000}, {"ttft_p95_ms", s.p95 * 1000}});
  }
  return out;
}

// Multiply-adds of every linear layer per token (attention scores excluded), times two.
double linear_flops_per_token(const ModelConfig& c) {
  const double q = double(c.n_heads * c.head_dim), kv = double(c.n_kv_heads * c.head_dim), d = double(c.dim);
  const double per_layer = d * q + 2 * d * kv + q * d + 3 * d * double(c.ffn_dim);
  return 2 * (double(c.n_layers) * per_layer + d * double(c.vocab));
}

json nullable(bool ok, double v) { return ok ? json(v) : json(nullptr); }

}  // namespace

json pipeline_metrics(const PipelineRun& run, const PipelineRun* reference, const Trace& trace,
                      const Workload& workload, const json& machine) {
  json m = {{"name", run.name}, {"file", run.file}, {"status", run.ok() ? "ok" : "failed"}};
  if (!run.error.empty()) {
    m["error"] = run.error;
    m["failed_stage"] = run.failed_stage;
  }
  if (!run.ok()) return m;
  const RunResult& rr = run.run;
  const double seconds = rr.seconds();
  const bool http = !run.server.empty();
  m["pipeline"] = run.describe;
  m["backend"] = run.backend;
  m["model"] = {{"path", run.model_path},
                {"name", run.model.name},
                {"weights", run.weight_formats},
                {"decode_regions", run.decode_regions},
                {"weight_bytes", run.weight_bytes},
                {"context", run.model.context_length}};
  if (http) {
    m["server"] = {{"url", run.server},
                   {"model", run.served_model},
                   {"ignore_eos", run.ignore_eos},
                   {"prompt_token_mismatches", run.prompt_token_mismatches},
                   {"usage_missing", run.usage_missing},
                   {"itl_basis", "chunks"},
                   {"metrics", run.server_metrics}};
    m["model"] = {{"path", nullptr}, {"name", run.served_model}, {"weights", nullptr}, {"decode_regions", nullptr},
                  {"weight_bytes", nullptr},
                  {"context", nullptr}};
  }
  m["build_seconds"] = http ? json(nullptr) : json(run.build_seconds);
  m["duration_s"] = seconds;

  Samples all;
  std::map<std::string, Samples> by_class, by_user, by_variant;
  std::map<std::string, int64_t> reasons;
  for (size_t i = 0; i < rr.results.size(); ++i) {
    const GenerationResult& r = rr.results[i];
    const TraceRequest& t = trace.requests[i];
    all.add(r);
    by_class[workload.classes[size_t(t.klass)].name].add(r);
    by_user[user_name(t.user)].add(r);
    if (i < run.variants.size()) by_variant[run.variants[i]].add(r);
    ++reasons[std::string(finish_reason_name(r.reason))];
  }
  json errors = json::array();
  for (const auto& r : rr.results) {
    if (r.reason == FinishReason::error && errors.size() < 5) errors.push_back(r.error);
  }
  m["requests"] = {{"total", all.count},         {"completed", all.count - all.errors}, {"errors", all.errors},
                   {"error_messages", errors},   {"finish_reasons", reasons},          {"clamped", trace.clamped}};
  m["latency_ms"] = all.latency_json();
  m["throughput"] = {{"output_tokens", all.output_tokens},
                     {"prompt_tokens", all.prompt_tokens},
                     {"output_tokens_per_s", nullable(seconds > 0, double(all.output_tokens) / seconds)},
                     {"requests_per_s", nullable(seconds > 0, double(all.count - all.errors) / seconds)},
                     {"prompt_tokens_per_s", nullable(seconds > 0, double(all.prompt_tokens) / seconds)}};
  if (http) {
    // Memory and engine internals are the server's; a tessera server's /metrics gives some of them.
    const json& sm = run.server_metrics;
    auto from = [&sm](const char* k) { return sm.is_object() && sm.contains(k) ? sm[k] : json(nullptr); };
    m["memory"] = {{"peak_rss_bytes", nullptr}, {"peak_rss_scope", "n/a over HTTP"}, {"weight_bytes", nullptr},
                   {"kv_bytes_total", nullptr}, {"kv_bytes_peak", nullptr}, {"kv_blocks_peak", nullptr},
                   {"kv_blocks_total", from("kv_blocks_total")}};
    m["prefix"] = {{"hit_rate", from("prefix_hit_rate")},
                   {"lookups", nullptr},
                   {"lookup_tokens", from("prefix_lookup_tokens")},
                   {"hit_tokens", from("prefix_hit_tokens")},
                   {"evictions", from("prefix_evictions")},
                   {"cached_prompt_share", all.prefix_share()}};
    m["draft"] = {{"acceptance", nullptr}, {"note", "n/a over HTTP"}};
    m["engine"] = {{"steps", from("steps")}, {"prefill_tokens", nullptr}, {"decode_tokens", nullptr},
                   {"preemptions", from("preemptions")}, {"peak_running", nullptr}};
  } else {
    m["memory"] = {{"peak_rss_bytes", run.peak_rss},
                   {"peak_rss_scope", run.peak_rss_per_pipeline ? "pipeline" : "process"},
                   {"weight_bytes", run.weight_bytes},
                   {"kv_bytes_total", rr.cache.bytes_total},
                   {"kv_bytes_peak", rr.kv_bytes_peak},
                   {"kv_blocks_peak", rr.kv_blocks_peak},
                   {"kv_blocks_total", rr.cache.blocks_total}};
    const PrefixStats& p = rr.cache.prefix;
    m["prefix"] = {{"hit_rate", p.lookups > 0 ? json(p.hit_rate()) : json(nullptr)},
                   {"lookups", p.lookups},
                   {"lookup_tokens", p.lookup_tokens},
                   {"hit_tokens", p.hit_tokens},
                   {"evictions", p.evictions},
                   {"cached_prompt_share", all.prefix_share()}};
    // The speculative decoder does not exist yet; the field is kept so reports keep one shape.
    m["draft"] = {{"acceptance", nullptr}, {"note", "n/a: no speculative decoder in this pipeline"}};
    m["engine"] = {{"steps", rr.engine.steps},
                   {"prefill_tokens", rr.engine.prefill_tokens},
                   {"decode_tokens", rr.engine.decode_tokens},
                   {"preemptions", rr.engine.preemptions},
                   {"peak_running", rr.engine.peak_running}};
  }

  json classes = json::object();
  for (const auto& [name, s] : by_class) {
    classes[name] = {{"count", s.count},
                     {"errors", s.errors},
                     {"output_tokens", s.output_tokens},
                     {"latency_ms", s.latency_json()},
                     {"cached_prompt_share", s.prefix_share()}};
  }
  m["classes"] = classes;
  json users = json::object();
  for (const auto& [name, s] : by_user) {
    const auto it = rr.cache.users.find(name);
    const json cache_hit = it != rr.cache.users.end() && it->second.lookups > 0 ? json(it->second.hit_rate())
                                                                                 : json(nullptr);
    users[name] = {{"count", s.count},
                   {"errors", s.errors},
                   {"output_tokens", s.output_tokens},
                   {"latency_ms", s.latency_json()},
                   {"cached_prompt_share", s.prefix_share()},
                   {"prefix_hit_rate", cache_hit}};
  }
  m["users"] = users;
  // A deployment's canary beside its stable variant, as the server's header says which one answered
  // (empty for in-process pipelines and servers that send no header).
  json variants = json::object();
  const bool any_variant = std::any_of(by_variant.begin(), by_variant.end(), [](const auto& v) { return !v.first.empty(); });
  for (const auto& [name, s] : by_variant) {
    if (!any_variant) break;
    variants[name.empty() ? "(no header)" : name] = {
        {"count", s.count},
        {"errors", s.errors},
        {"output_tokens", s.output_tokens},
        {"output_tokens_per_s", nullable(seconds > 0, double(s.output_tokens) / seconds)},
        {"latency_ms", s.latency_json()}};
  }
  m["variants"] = variants;
  m["cdf_ms"] = {{"ttft", cdf_json(all.ttft)}, {"tpot", cdf_json(all.tpot)}, {"e2e", cdf_json(all.e2e)}};
  m["ttft_by_load"] = ttft_by_load(rr.results);

  if (workload.arrival.process == Arrival::Process::poisson) {
    std::vector<double> lag;
    for (size_t i = 0; i < rr.results.size(); ++i) lag.push_back(rr.results[i].submitted - rr.scheduled[i]);
    m["submit_lag_ms"] = summary_json(summarize(lag), 1000);
  } else {
    m["submit_lag_ms"] = nullptr;  // a closed loop submits when a client is free: no schedule to lag
  }

  // The run as a share of the machine's measured limits.
  if (seconds > 0 && !http) {
    const double read_gbs = double(run.weight_bytes) * double(rr.engine.steps) / seconds / 1e9;
    const double gflops =
        linear_flops_per_token(run.model) * double(rr.engine.prefill_tokens + rr.engine.decode_tokens) / seconds / 1e9;
    json share = {{"weight_read_gbs", read_gbs}, {"linear_gflops", gflops}};
    const double bw = machine.value("read_bandwidth_gbs", 0.0), fma = machine.value("fma_peak_gflops", 0.0);
    share["of_bandwidth"] = nullable(bw > 0, read_gbs / bw);
    share["of_fma_peak"] = nullable(fma > 0, gflops / fma);
    m["machine_share"] = share;
  }

  // Greedy outputs on the trace itself, token for token against the reference.
  json acc = run.accuracy;
  // One shape whether the accuracy pass ran, failed, was skipped (--no-accuracy) or cannot run (a
  // server): every figure present, null where not measured.
  for (const char* k : {"text", "ctx", "scored_tokens", "perplexity", "perplexity_delta", "perplexity_delta_percent",
                        "teacher_forced_agreement", "kl_divergence", "greedy_agreement", "greedy_prompts",
                        "greedy_tokens_per_prompt"}) {
    if (!acc.contains(k)) acc[k] = nullptr;
  }
  if (run.accuracy.empty()) acc["note"] = "n/a: no accuracy pass ran (--no-accuracy, or a server is the reference)";
  if (reference != nullptr && reference->ok() && run.greedy && reference->greedy &&
      (http || !reference->server.empty())) {
    // Output ids are not known over HTTP: the texts are compared, character for character.
    int64_t same = 0, compared = 0, common = 0, ref_chars = 0;
    for (size_t i = 0; i < rr.results.size(); ++i) {
      const auto& a = rr.results[i];
      const auto& b = reference->run.results[i];
      if (a.reason == FinishReason::error || b.reason == FinishReason::error) continue;
      ++compared;
      const auto mm = std::mismatch(a.text.begin(), a.text.end(), b.text.begin(), b.text.end());
      common += int64_t(mm.first - a.text.begin());
      ref_chars += int64_t(b.text.size());
      if (a.text == b.text) ++same;
    }
    acc["trace_identical_requests"] = same;
    acc["trace_compared_requests"] = compared;
    acc["trace_agreement"] = nullable(ref_chars > 0, double(common) / double(ref_chars));
    acc["trace_agreement_basis"] = "text";
  } else if (reference != nullptr && reference->ok() && run.greedy && reference->greedy) {
    int64_t same = 0, compared = 0, common = 0, ref_tokens = 0;
    for (size_t i = 0; i < rr.results.size(); ++i) {
      const auto& a = rr.results[i];
      const auto& b = reference->run.results[i];
      if (a.reason == FinishReason::error || b.reason == FinishReason::error) continue;
      ++compared;
      size_t k = 0;
      while (k < a.tokens.size() && k < b.tokens.size() && a.tokens[k] == b.tokens[k]) ++k;
      common += int64_t(k);
      ref_tokens += int64_t(b.tokens.size());
      if (a.tokens == b.tokens) ++same;
    }
    acc["trace_identical_requests"] = same;
    acc["trace_compared_requests"] = compared;
    acc["trace_agreement"] = nullable(ref_tokens > 0, double(common) / double(ref_tokens));
    acc["trace_agreement_basis"] = "tokens";
  } else if (!acc.contains("trace_agreement")) {
    acc["trace_agreement"] = nullptr;
    acc["trace_agreement_note"] = "n/a: needs greedy decoding in this pipeline and the reference";
  }
  m["accuracy"] = acc;
  return m;
}

json ratios(const json& m, const json& ref) {
  json r = json::object();
  auto ratio = [](const json& a, const json& b) -> json {
    if (!a.is_number() || !b.is_number() || b.get<double>() == 0) return nullptr;
    return a.get<double>() / b.get<double>();
  };
  for (const char* metric : {"ttft", "tpot", "itl", "e2e"}) {
    for (const char* stat : {"mean", "p50", "p95", "p99"}) {
      r[std::string(metric) + "_" + stat] = ratio(m["latency_ms"][metric][stat], ref["latency_ms"][metric][stat]);
    }
  }
  for (const char* k : {"output_tokens_per_s", "requests_per_s", "prompt_tokens_per_s"}) {
    r[k] = ratio(m["throughput"][k], ref["throughput"][k]);
  }
  for (const char* k : {"peak_rss_bytes", "kv_bytes_total", "kv_bytes_peak", "weight_bytes"}) {
    r[k] = ratio(m["memory"][k], ref["memory"][k]);
  }
  return r;
}

}  // namespace tessera::bench
