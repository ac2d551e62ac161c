#include "metrics.h"

#include <algorithm>
#include <cstdio>

namespace tessera::serve {

namespace {

// Latencies of a tiny CPU model and of a large GPU one both fall inside these.
const std::vector<double> kTtftBuckets = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
const std::vector<double> kItlBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5};

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

void header(std::string& out, const std::string& name, const char* type, const char* help) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void sample(std::string& out, const std::string& name, const std::string& labels, double v) {
  out += name;
  if (!labels.empty()) {
    out += '{';
    out += labels;
    out += '}';
  }
  out += ' ';
  out += num(v);
  out += '\n';
}

std::string user_label(const std::string& user) { return "user=\"" + prom_escape(user) + "\""; }

// Speculative decoding, from the engine's counters (server-wide; the engine does not keep them per
// request): draft tokens the target scored, those it accepted, and their ratio. A pipeline that does
// not speculate states nothing about drafts rather than zeros.
void write_draft_metrics(std::string& out, const EngineSnapshot& snapshot, bool speculates) {
  if (!speculates) return;
  const SpeculationStats& s = snapshot.engine.speculation;
  header(out, "tessera_draft_tokens_total", "counter", "Draft tokens the target model verified.");
  sample(out, "tessera_draft_tokens_total", "", double(s.proposed));
  header(out, "tessera_draft_accepted_total", "counter", "Draft tokens the target model accepted.");
  sample(out, "tessera_draft_accepted_total", "", double(s.accepted));
  header(out, "tessera_draft_verifications_total", "counter", "Sequence steps that verified drafts.");
  sample(out, "tessera_draft_verifications_total", "", double(s.verifications));
  header(out, "tessera_draft_acceptance_rate", "gauge", "Accepted over verified draft tokens, since the start.");
  sample(out, "tessera_draft_acceptance_rate", "", s.acceptance_rate());
}

void add_prefix(PrefixStats& sum, const PrefixStats& p) {
  sum.lookups += p.lookups;
  sum.lookup_tokens += p.lookup_tokens;
  sum.hit_tokens += p.hit_tokens;
  sum.cached_blocks += p.cached_blocks;
  sum.evictions += p.evictions;
}

void add_snapshot(EngineSnapshot& sum, const EngineSnapshot& s) {
  EngineStats& e = sum.engine;
  e.steps += s.engine.steps;
  e.prefill_tokens += s.engine.prefill_tokens;
  e.decode_tokens += s.engine.decode_tokens;
  e.preemptions += s.engine.preemptions;
  e.waiting += s.engine.waiting;
  e.running += s.engine.running;
  e.peak_running += s.engine.peak_running;
  e.speculation.verifications += s.engine.speculation.verifications;
  e.speculation.proposed += s.engine.speculation.proposed;
  e.speculation.accepted += s.engine.speculation.accepted;
  e.constrained_tokens += s.engine.constrained_tokens;
  e.mask_seconds += s.engine.mask_seconds;
  CacheStats& c = sum.cache;
  c.blocks_total += s.cache.blocks_total;
  c.blocks_used += s.cache.blocks_used;
  c.sequences += s.cache.sequences;
  add_prefix(c.prefix, s.cache.prefix);
  for (const auto& [user, p] : s.cache.users) add_prefix(c.users[user], p);
  sum.in_flight += s.in_flight;
}

std::string variant_labels(const std::string& model, const std::string& variant) {
  return "model=\"" + prom_escape(model) + "\",variant=\"" + prom_escape(variant) + "\"";
}

}  // namespace

std::string prom_escape(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

void Histogram::observe(double v) {
  const size_t i = size_t(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::write(std::string& out, const std::string& name, const std::string& labels) const {
  const std::string sep = labels.empty() ? "" : ",";
  int64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    sample(out, name + "_bucket", labels + sep + "le=\"" + num(bounds_[i]) + "\"", double(cumulative));
  }
  sample(out, name + "_bucket", labels + sep + "le=\"+Inf\"", double(count_));
  sample(out, name + "_sum", labels, sum_);
  sample(out, name + "_count", labels, double(count_));
}

ServerMetrics::Series::Series() : ttft(kTtftBuckets), itl(kItlBuckets) {}

ServerMetrics::ServerMetrics() = default;

ServerMetrics::Series& ServerMetrics::user_series(const std::string& user) {
  const std::string name = user.empty() ? "anonymous" : user;
  auto it = users_.find(name);
  if (it != users_.end()) return it->second;
  if (users_.size() >= kMaxUsers) return users_["_other"];
  return users_[name];
}

void ServerMetrics::count_http(const std::string& route, int status) {
  std::lock_guard lock(mutex_);
  ++requests_[{route, status}];
}

void ServerMetrics::count_user(const std::string& user, int status) {
  std::lock_guard lock(mutex_);
  ++user_series(user).requests[status];
}

void ServerMetrics::count_reload() {
  std::lock_guard lock(mutex_);
  ++reloads_;
}

void ServerMetrics::count_constrained(const std::string& kind) {
  std::lock_guard lock(mutex_);
  ++constrained_[kind];
}

void ServerMetrics::observe(const std::string& user, const std::string& model, const std::string& variant,
                            const GenerationResult& r) {
  std::lock_guard lock(mutex_);
  Series& by_variant = variants_[{model, variant}];
  ++by_variant.requests[r.reason == FinishReason::error ? 500 : r.reason == FinishReason::cancelled ? 499 : 200];
  for (Series* s : {&global_, &user_series(user), &by_variant}) {
    s->prompt_tokens += int64_t(r.prompt.size());
    s->completion_tokens += int64_t(r.tokens.size());
    s->cached_tokens += r.cached_tokens;
    if (r.first_token > 0) s->ttft.observe(r.ttft());
    for (double d : r.inter_token_times()) s->itl.observe(d);
  }
}

std::string ServerMetrics::render(const std::vector<VariantSnapshot>& variants, int64_t http_in_flight) const {
  // The server's totals: every variant's engine added up.
  EngineSnapshot snap;
  bool speculates = false;
  for (const VariantSnapshot& v : variants) add_snapshot(snap, v.snapshot);
  for (const VariantSnapshot& v : variants) speculates = speculates || v.speculates;
  std::lock_guard lock(mutex_);
  std::string out;
  header(out, "tessera_http_requests_total", "counter", "HTTP requests answered, by route and status.");
  for (const auto& [key, n] : requests_) {
    sample(out, "tessera_http_requests_total",
           "route=\"" + prom_escape(key.first) + "\",status=\"" + std::to_string(key.second) + "\"", double(n));
  }
  header(out, "tessera_user_requests_total", "counter", "Generation requests answered, by user and status.");
  for (const auto& [user, s] : users_) {
    for (const auto& [status, n] : s.requests) {
      sample(out, "tessera_user_requests_total", user_label(user) + ",status=\"" + std::to_string(status) + "\"",
             double(n));
    }
  }

  header(out, "tessera_constrained_requests_total", "counter",
         "Generation requests with structured output (response_format, guided_*, tool_choice required or named), by kind.");
  for (const auto& [kind, n] : constrained_) {
    sample(out, "tessera_constrained_requests_total", "type=\"" + prom_escape(kind) + "\"", double(n));
  }

  struct Counter {
    const char* name;
    const char* help;
    int64_t Series::*field;
  };
  const Counter counters[] = {
      {"prompt_tokens_total", "Prompt tokens of finished requests.", &Series::prompt_tokens},
      {"generation_tokens_total", "Tokens generated by finished requests.", &Series::completion_tokens},
      {"prompt_cached_tokens_total", "Prompt tokens whose KV came from the prefix cache.", &Series::cached_tokens},
  };
  for (const Counter& c : counters) {
    const std::string g = std::string("tessera_") + c.name;
    header(out, g, "counter", c.help);
    sample(out, g, "", double(global_.*c.field));
    const std::string u = std::string("tessera_user_") + c.name;
    header(out, u, "counter", c.help);
    for (const auto& [user, s] : users_) sample(out, u, user_label(user), double(s.*c.field));
  }

  header(out, "tessera_time_to_first_token_seconds", "histogram", "Submission to first generated token.");
  global_.ttft.write(out, "tessera_time_to_first_token_seconds", "");
  header(out, "tessera_user_time_to_first_token_seconds", "histogram", "Time to first token, per user.");
  for (const auto& [user, s] : users_) s.ttft.write(out, "tessera_user_time_to_first_token_seconds", user_label(user));
  header(out, "tessera_inter_token_latency_seconds", "histogram", "Time between consecutive generated tokens.");
  global_.itl.write(out, "tessera_inter_token_latency_seconds", "");
  header(out, "tessera_user_inter_token_latency_seconds", "histogram", "Inter-token latency, per user.");
  for (const auto& [user, s] : users_) s.itl.write(out, "tessera_user_inter_token_latency_seconds", user_label(user));

  const EngineStats& e = snap.engine;
  const CacheStats& c = snap.cache;
  const std::pair<const char*, double> gauges[] = {
      {"tessera_queue_depth", double(e.waiting)},
      {"tessera_requests_running", double(e.running)},
      {"tessera_requests_in_flight", double(http_in_flight)},
      {"tessera_kv_blocks_total", double(c.blocks_total)},
      {"tessera_kv_blocks_used", double(c.blocks_used)},
      {"tessera_kv_blocks_free", double(c.blocks_total - c.blocks_used)},
      {"tessera_kv_sequences", double(c.sequences)},
  };
  const char* gauge_help[] = {"Requests waiting for admission to the engine.",
                              "Sequences the engine is running.",
                              "HTTP generation requests being served (running, waiting or streaming).",
                              "KV cache blocks in the pool.",
                              "KV cache blocks holding running sequences (blocks that only keep a cached prefix "
                              "count as free: tessera_prefix_cache_blocks).",
                              "KV cache blocks free.",
                              "Sequences holding KV cache blocks."};
  for (size_t i = 0; i < std::size(gauges); ++i) {
    header(out, gauges[i].first, "gauge", gauge_help[i]);
    sample(out, gauges[i].first, "", gauges[i].second);
  }
  const std::pair<const char*, int64_t> engine_counters[] = {
      {"tessera_engine_steps_total", e.steps},
      {"tessera_engine_prefill_tokens_total", e.prefill_tokens},
      {"tessera_engine_decode_tokens_total", e.decode_tokens},
      {"tessera_engine_preemptions_total", e.preemptions},
  };
  for (const auto& [name, v] : engine_counters) {
    header(out, name, "counter", "Engine counter (see EngineStats).");
    sample(out, name, "", double(v));
  }
  header(out, "tessera_constrained_tokens_total", "counter", "Tokens generated under a constraint (structured output).");
  sample(out, "tessera_constrained_tokens_total", "", double(e.constrained_tokens));
  header(out, "tessera_constraint_mask_seconds_total", "counter",
         "Time spent computing and applying token masks for those tokens (divide by tessera_constrained_tokens_total for the time per token).");
  sample(out, "tessera_constraint_mask_seconds_total", "", e.mask_seconds);

  // Prefix reuse (zero for caches without it), globally and per user as the cache reports them.
  header(out, "tessera_prefix_cache_hit_rate", "gauge", "Share of looked-up tokens found in the prefix cache (lookups include recomputation after preemption).");
  sample(out, "tessera_prefix_cache_hit_rate", "", c.prefix.hit_rate());
  header(out, "tessera_prefix_cache_hit_tokens_total", "counter", "Tokens found in the prefix cache, at admission and at recomputation after preemption.");
  sample(out, "tessera_prefix_cache_hit_tokens_total", "", double(c.prefix.hit_tokens));
  header(out, "tessera_prefix_cache_lookup_tokens_total", "counter", "Tokens looked up in the prefix cache, at admission and at recomputation after preemption.");
  sample(out, "tessera_prefix_cache_lookup_tokens_total", "", double(c.prefix.lookup_tokens));
  header(out, "tessera_prefix_cache_blocks", "gauge", "Full blocks held for prefix reuse.");
  sample(out, "tessera_prefix_cache_blocks", "", double(c.prefix.cached_blocks));
  header(out, "tessera_prefix_cache_evictions_total", "counter", "Cached prefix blocks evicted.");
  sample(out, "tessera_prefix_cache_evictions_total", "", double(c.prefix.evictions));
  header(out, "tessera_user_prefix_cache_hit_rate", "gauge", "Prefix cache hit rate, per user.");
  for (const auto& [user, p] : c.users) sample(out, "tessera_user_prefix_cache_hit_rate", user_label(user), p.hit_rate());
  header(out, "tessera_user_prefix_cache_hit_tokens_total", "counter", "Tokens found in the prefix cache, per user (recomputation included).");
  for (const auto& [user, p] : c.users) {
    sample(out, "tessera_user_prefix_cache_hit_tokens_total", user_label(user), double(p.hit_tokens));
  }
  header(out, "tessera_user_prefix_cache_blocks", "gauge", "Full blocks held for prefix reuse, per user.");
  for (const auto& [user, p] : c.users) sample(out, "tessera_user_prefix_cache_blocks", user_label(user), double(p.cached_blocks));

  write_draft_metrics(out, snap, speculates);
  write_variants(out, variants);
  return out;
}

void ServerMetrics::write_variants(std::string& out, const std::vector<VariantSnapshot>& variants) const {
  header(out, "tessera_variant_weight", "gauge", "Each variant's weight: its share of its model's traffic is weight / the model's total.");
  for (const VariantSnapshot& v : variants) sample(out, "tessera_variant_weight", variant_labels(v.model, v.variant), v.weight);
  const Series none;
  auto series = [&](const VariantSnapshot& v) -> const Series& {
    const auto it = variants_.find({v.model, v.variant});
    return it == variants_.end() ? none : it->second;
  };
  header(out, "tessera_reloads_total", "counter", "Reloads of the deployment file that took effect (SIGHUP, POST /admin/reload).");
  sample(out, "tessera_reloads_total", "", double(reloads_));
  header(out, "tessera_rollbacks_total", "counter",
         "Canaries rolled back (weight set to 0) by the model's rollback guard, by reason: error_rate, ttft_p99, tpot_p99, "
         "perplexity.");
  for (const VariantSnapshot& v : variants) {
    for (const auto& [reason, n] : v.rollbacks) {
      sample(out, "tessera_rollbacks_total", variant_labels(v.model, v.variant) + ",reason=\"" + reason + "\"", double(n));
    }
  }
  header(out, "tessera_variant_requests_total", "counter",
         "Generation requests a variant finished, by outcome (200 answered, 499 cancelled, 500 failed).");
  for (const VariantSnapshot& v : variants) {
    for (const auto& [status, n] : series(v).requests) {
      sample(out, "tessera_variant_requests_total",
             variant_labels(v.model, v.variant) + ",status=\"" + std::to_string(status) + "\"", double(n));
    }
  }
  header(out, "tessera_variant_prompt_tokens_total", "counter", "Prompt tokens of finished requests, per variant.");
  for (const VariantSnapshot& v : variants) {
    sample(out, "tessera_variant_prompt_tokens_total", variant_labels(v.model, v.variant), double(series(v).prompt_tokens));
  }
  header(out, "tessera_variant_generation_tokens_total", "counter", "Tokens generated by finished requests, per variant.");
  for (const VariantSnapshot& v : variants) {
    sample(out, "tessera_variant_generation_tokens_total", variant_labels(v.model, v.variant),
           double(series(v).completion_tokens));
  }
  header(out, "tessera_variant_time_to_first_token_seconds", "histogram", "Time to first token, per variant.");
  for (const VariantSnapshot& v : variants) {
    series(v).ttft.write(out, "tessera_variant_time_to_first_token_seconds", variant_labels(v.model, v.variant));
  }
  header(out, "tessera_variant_inter_token_latency_seconds", "histogram", "Inter-token latency, per variant.");
  for (const VariantSnapshot& v : variants) {
    series(v).itl.write(out, "tessera_variant_inter_token_latency_seconds", variant_labels(v.model, v.variant));
  }
  struct Gauge {
    const char* name;
    const char* help;
    double (*value)(const VariantSnapshot&);
  };
  static constexpr Gauge gauges[] = {
      {"tessera_variant_queue_depth", "Requests waiting for admission to the variant's engine.",
       [](const VariantSnapshot& v) { return double(v.snapshot.engine.waiting); }},
      {"tessera_variant_requests_running", "Sequences the variant's engine is running.",
       [](const VariantSnapshot& v) { return double(v.snapshot.engine.running); }},
      {"tessera_variant_kv_blocks_used", "KV cache blocks holding the variant's running sequences.",
       [](const VariantSnapshot& v) { return double(v.snapshot.cache.blocks_used); }},
      {"tessera_variant_kv_blocks_total", "KV cache blocks in the variant's pool.",
       [](const VariantSnapshot& v) { return double(v.snapshot.cache.blocks_total); }},
      {"tessera_variant_weight_bytes",
       "Backend memory of the weights the variant runs on; variants sharing one load (same model file, "
       "backend and quantizer) report the same bytes, held once.",
       [](const VariantSnapshot& v) { return double(v.weight_bytes); }}};
  for (const Gauge& g : gauges) {
    header(out, g.name, "gauge", g.help);
    for (const VariantSnapshot& v : variants) sample(out, g.name, variant_labels(v.model, v.variant), g.value(v));
  }
}

}  // namespace tessera::serve
