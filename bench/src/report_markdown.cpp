// The report as Markdown, rendered from the JSON document.
#include <iomanip>
#include <sstream>

#include "tessera/bench/report.h"

namespace tessera::bench {

namespace {

using nlohmann::json;

std::string num(const json& v, int digits = 1) {
  if (!v.is_number()) return "n/a";
  std::ostringstream s;
  s << std::fixed << std::setprecision(digits) << v.get<double>();
  return s.str();
}
std::string mib(const json& v) { return v.is_number() ? num(json(v.get<double>() / (1024.0 * 1024.0)), 2) : "n/a"; }
std::string pct(const json& v) { return v.is_number() ? num(json(v.get<double>() * 100), 1) + "%" : "n/a"; }
std::string ratio(const json& v) { return v.is_number() ? "x" + num(v, 2) : "n/a"; }
// An integer figure; "n/a" where a column cannot measure it (servers over HTTP).
std::string count(const json& v) { return v.is_number() ? std::to_string(v.get<int64_t>()) : "n/a"; }
std::string str(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }
const json& at(const json& j, std::initializer_list<const char*> path) {
  static const json null_value;
  const json* cur = &j;
  for (const char* k : path) {
    if (!cur->is_object() || !cur->contains(k)) return null_value;
    cur = &(*cur)[k];
  }
  return *cur;
}

void row(std::ostringstream& out, const std::vector<std::string>& cells) {
  out << "|";
  for (const auto& c : cells) out << " " << c << " |";
  out << "\n";
}
void header(std::ostringstream& out, const std::vector<std::string>& cells) {
  row(out, cells);
  out << "|";
  for (size_t i = 0; i < cells.size(); ++i) out << (i == 0 ? " --- |" : " ---: |");
  out << "\n";
}

void latency_rows(std::ostringstream& out, const std::string& label, const json& lat) {
  for (const char* m : {"ttft", "tpot", "itl", "e2e", "queue"}) {
    const json& s = lat[m];
    row(out, {label, m, num(s["mean"], 2), num(s["p50"], 2), num(s["p95"], 2), num(s["p99"], 2),
              std::to_string(s.value("count", 0))});
  }
}

}  // namespace

std::string render_markdown(const json& r) {
  std::ostringstream out;
  const json& w = r["workload"];
  const json& c = r["conditions"];
  const std::string ref = r["reference"].is_string() ? r["reference"].get<std::string>() : "";
  out << "# tessera bench: " << str(w["name"]) << "\n\n";
  if (!str(w["description"]).empty()) out << str(w["description"]) << "\n\n";
  out << "Reference (ratios are against it): **" << (ref.empty() ? "none ran" : ref) << "**";
  if (r.contains("reference_note")) out << " (" << str(r["reference_note"]) << ")";
  out << ". One run each on the identical trace; differences under " << num(r["noise_threshold"].get<double>() * 100, 0)
      << "% are treated as noise.\n\n";

  const json& q = r["five_questions"];
  out << "## Five questions\n\n";
  out << "1. **What got faster?**\n";
  for (const auto& l : q["what_got_faster"]) out << "   - " << str(l) << "\n";
  out << "2. **Under which conditions?** " << str(q["under_which_conditions"]) << "\n";
  out << "3. **For which request classes?**\n";
  for (const auto& l : q["for_which_request_classes"]) out << "   - " << str(l) << "\n";
  out << "4. **At what cost (memory, accuracy)?**\n";
  for (const auto& l : q["at_what_cost"]) out << "   - " << str(l) << "\n";
  out << "5. **How to reproduce it?**\n\n   ```\n   " << str(q["reproduce"]) << "\n   ```\n\n";

  out << "## Results\n\n";
  header(out, {"pipeline", "output tok/s", "req/s", "TTFT P50 ms", "TTFT P95 ms", "TTFT P99 ms", "TPOT P50 ms",
               "TPOT P95 ms", "E2E P50 ms", "E2E P95 ms", "peak RSS MiB", "KV pool MiB", "KV peak MiB",
               "prefix hit", "draft accept", "ppl delta", "greedy agree", "errors"});
  for (const auto& p : r["pipelines"]) {
    if (p["status"] != "ok") {
      row(out, {str(p["name"]), "failed (" + str(p["failed_stage"]) + ")", "", "", "", "", "", "", "", "", "", "", "",
                "", "", "", "", ""});
      continue;
    }
    const json& l = p["latency_ms"];
    row(out, {str(p["name"]), num(p["throughput"]["output_tokens_per_s"], 0), num(p["throughput"]["requests_per_s"], 2),
              num(l["ttft"]["p50"]), num(l["ttft"]["p95"]), num(l["ttft"]["p99"]), num(l["tpot"]["p50"], 2),
              num(l["tpot"]["p95"], 2), num(l["e2e"]["p50"]), num(l["e2e"]["p95"]),
              mib(p["memory"]["peak_rss_bytes"]), mib(p["memory"]["kv_bytes_total"]),
              mib(p["memory"]["kv_bytes_peak"]), pct(p["prefix"]["hit_rate"]), pct(p["draft"]["acceptance"]),
              at(p, {"accuracy", "perplexity_delta_percent"}).is_number()
                  ? num(at(p, {"accuracy", "perplexity_delta_percent"}), 2) + "%"
                  : "n/a",
              num(at(p, {"accuracy", "greedy_agreement"}), 3), std::to_string(p["requests"]["errors"].get<int64_t>())});
  }
  out << "\n";

  out << "## Ratios against " << (ref.empty() ? "the reference" : ref)
      << "\n\nLatency and memory: below 1 is better. Throughput: above 1 is better.\n\n";
  header(out, {"pipeline", "output tok/s", "req/s", "TTFT P50", "TTFT P95", "TTFT P99", "TPOT P50", "TPOT P95",
               "TPOT P99", "ITL P50", "ITL P95", "E2E P50", "E2E P95", "E2E P99", "peak RSS", "KV pool", "KV peak"});
  for (const auto& p : r["pipelines"]) {
    if (p["status"] != "ok") continue;
    const json& x = p["ratios"];
    row(out, {str(p["name"]), ratio(x["output_tokens_per_s"]), ratio(x["requests_per_s"]), ratio(x["ttft_p50"]),
              ratio(x["ttft_p95"]), ratio(x["ttft_p99"]), ratio(x["tpot_p50"]), ratio(x["tpot_p95"]),
              ratio(x["tpot_p99"]), ratio(x["itl_p50"]), ratio(x["itl_p95"]), ratio(x["e2e_p50"]),
              ratio(x["e2e_p95"]), ratio(x["e2e_p99"]), ratio(x["peak_rss_bytes"]), ratio(x["kv_bytes_total"]),
              ratio(x["kv_bytes_peak"])});
  }
  out << "\n## Latency (ms)\n\nTTFT: submission to first token. TPOT: per request, (last token - first token) / "
         "(tokens - 1). ITL: every gap between tokens. E2E: submission to the last token. Queue: submission to the "
         "first step.\n\n";
  header(out, {"pipeline", "metric", "mean", "P50", "P95", "P99", "samples"});
  for (const auto& p : r["pipelines"]) {
    if (p["status"] == "ok") latency_rows(out, str(p["name"]), p["latency_ms"]);
  }

  out << "\n## Per request class\n\n";
  header(out, {"pipeline", "class", "requests", "TTFT P50 ms", "TTFT P95 ms", "TPOT P50 ms", "E2E P50 ms",
               "E2E P95 ms", "cached prompt share"});
  for (const auto& p : r["pipelines"]) {
    if (p["status"] != "ok") continue;
    for (const auto& [name, cl] : p["classes"].items()) {
      const json& l = cl["latency_ms"];
      row(out, {str(p["name"]), name, std::to_string(cl["count"].get<int64_t>()), num(l["ttft"]["p50"]),
                num(l["ttft"]["p95"]), num(l["tpot"]["p50"], 2), num(l["e2e"]["p50"]), num(l["e2e"]["p95"]),
                pct(cl["cached_prompt_share"])});
    }
  }
  out << "\n## Per user\n\n";
  header(out, {"pipeline", "user", "requests", "TTFT P50 ms", "TTFT P95 ms", "E2E P95 ms", "cached prompt share",
               "cache hit rate"});
  for (const auto& p : r["pipelines"]) {
    if (p["status"] != "ok") continue;
    for (const auto& [name, u] : p["users"].items()) {
      const json& l = u["latency_ms"];
      row(out, {str(p["name"]), name, std::to_string(u["count"].get<int64_t>()), num(l["ttft"]["p50"]),
                num(l["ttft"]["p95"]), num(l["e2e"]["p95"]), pct(u["cached_prompt_share"]), pct(u["prefix_hit_rate"])});
    }
  }

  // Only servers that name the variant answering (a tessera deployment with a canary) have rows.
  bool any_variant = false;
  for (const auto& p : r["pipelines"]) any_variant = any_variant || (p.contains("variants") && !p["variants"].empty());
  if (any_variant) {
    out << "\n## Per variant (the server's X-Tessera-Variant header)\n\n";
    header(out, {"server", "variant", "requests", "errors", "output tok/s", "TTFT P50 ms", "TTFT P99 ms", "TPOT P50 ms",
                 "TPOT P99 ms", "E2E P99 ms"});
    for (const auto& p : r["pipelines"]) {
      if (p["status"] != "ok" || !p.contains("variants")) continue;
      for (const auto& [name, v] : p["variants"].items()) {
        const json& l = v["latency_ms"];
        row(out, {str(p["name"]), name, std::to_string(v["count"].get<int64_t>()),
                  std::to_string(v["errors"].get<int64_t>()), num(v["output_tokens_per_s"]), num(l["ttft"]["p50"]),
                  num(l["ttft"]["p99"]), num(l["tpot"]["p50"], 2), num(l["tpot"]["p99"], 2), num(l["e2e"]["p99"])});
      }
    }
  }

  out << "\n## Accuracy against " << (ref.empty() ? "the reference" : ref) << "\n\n";
  header(out, {"pipeline", "perplexity", "delta", "KL divergence", "teacher-forced agreement", "greedy agreement",
               "trace agreement", "identical trace outputs", "note"});
  for (const auto& p : r["pipelines"]) {
    if (p["status"] != "ok") continue;
    const json& a = p["accuracy"];
    std::string note = a.contains("error") ? str(a["error"])
                       : a.contains("perplexity_note") ? str(a["perplexity_note"])
                       : a.contains("note")            ? str(a["note"])
                                                       : "";
    const json& delta = at(a, {"perplexity_delta_percent"});
    row(out, {str(p["name"]), num(at(a, {"perplexity"}), 4), delta.is_number() ? num(delta, 2) + "%" : "n/a",
              num(at(a, {"kl_divergence", "mean"}), 4), num(at(a, {"teacher_forced_agreement"}), 3), num(at(a, {"greedy_agreement"}), 3),
              num(at(a, {"trace_agreement"}), 3),
              a.contains("trace_identical_requests")
                  ? std::to_string(a["trace_identical_requests"].get<int64_t>()) + "/" +
                        std::to_string(a["trace_compared_requests"].get<int64_t>())
                  : "n/a",
              note});
  }

  out << "\n## Memory, engine and machine share\n\n";
  header(out, {"pipeline", "weights MiB", "peak RSS scope", "KV blocks peak/total", "steps", "prefill tokens",
               "decode tokens", "preemptions", "peak running", "weight GB/s (share of bandwidth)",
               "linear GFLOP/s (share of FMA peak)"});
  for (const auto& p : r["pipelines"]) {
    if (p["status"] != "ok") continue;
    const json& e = p["engine"];
    const json& s = at(p, {"machine_share"});
    row(out, {str(p["name"]), mib(p["memory"]["weight_bytes"]), str(p["memory"]["peak_rss_scope"]),
              count(p["memory"]["kv_blocks_peak"]) + "/" + count(p["memory"]["kv_blocks_total"]),
              count(e["steps"]), count(e["prefill_tokens"]), count(e["decode_tokens"]), count(e["preemptions"]),
              count(e["peak_running"]),
              num(at(s, {"weight_read_gbs"}), 2) + " (" + pct(at(s, {"of_bandwidth"})) + ")",
              num(at(s, {"linear_gflops"}), 2) + " (" + pct(at(s, {"of_fma_peak"})) + ")"});
  }

  if (!r["failed"].empty()) {
    out << "\n## Failed pipelines\n\n";
    for (const auto& f : r["failed"]) out << "- **" << str(f["name"]) << "** (" << str(f["stage"]) << "): " << str(f["error"]) << "\n";
  }

  out << "\n## Conditions\n\n";
  out << "- CPU: " << str(at(c, {"cpu", "model"})) << ", " << str(at(c, {"cpu", "cores"})) << " cores ("
      << str(at(c, {"cpu", "usable_cores"})) << " usable), " << str(c["threads"]) << " threads\n";
  out << "- Memory: " << num(json(c.value("memory_bytes", 0.0) / 1073741824.0), 1) << " GiB\n";
  out << "- Measured limits: read bandwidth " << num(at(c, {"machine", "read_bandwidth_gbs"}), 2) << " GB/s ("
      << str(at(c, {"machine", "read_bandwidth_method"})) << "), FMA peak " << num(at(c, {"machine", "fma_peak_gflops"}), 1)
      << " GFLOP/s (" << str(at(c, {"machine", "fma_peak_method"})) << ")";
  if (const json& trip = at(c, {"machine", "core_round_trip_ns"}); trip.is_number()) {
    out << ", core-to-core round trip " << num(trip, 0) << " ns (" << str(at(c, {"machine", "core_round_trip_method"})) << ")";
  }
  out << "\n";
  out << "- Backend: " << str(at(c, {"backend"})) << "; model " << str(at(c, {"model", "path"})) << " ("
      << str(at(c, {"model", "name"})) << ", " << str(at(c, {"model", "weights"})) << ", context "
      << str(at(c, {"model", "context"})) << ")\n";
  out << "- Build: " << str(c["build_type"]) << ", commit " << str(c["git_commit"]) << ", tessera " << str(c["version"])
      << ", " << str(c["compiler"]) << "; " << str(c["date"]) << "\n";
  out << "- Load: " << str(at(w, {"arrival", "description"})) << "; " << str(w["requests"]) << " requests, seed "
      << str(w["seed"]) << ", " << str(at(w, {"users", "count"})) << " users (" << str(at(w, {"users", "distribution"}))
      << "), prompts from " << str(w["prompts"]) << ", ignore_eos " << str(w["ignore_eos"]) << ", trace "
      << str(at(w, {"trace", "fingerprint"})) << " (" << str(at(w, {"trace", "prompt_tokens"})) << " prompt / "
      << str(at(w, {"trace", "output_tokens"})) << " output tokens, " << str(at(w, {"trace", "clamped_requests"}))
      << " clamped)\n";
  if (at(w, {"system_prompt", "length"}).is_number() && at(w, {"system_prompt", "length"}).get<int64_t>() > 0) {
    out << "- System prompt: " << str(at(w, {"system_prompt", "length"})) << " tokens on "
        << pct(at(w, {"system_prompt", "share"})) << " of requests, scope " << str(at(w, {"system_prompt", "scope"}))
        << "\n";
  }
  out << "\n";
  header(out, {"class", "weight", "prompt tokens", "output tokens", "requests"});
  for (const auto& cl : w["classes"]) {
    row(out, {str(cl["name"]), num(cl["weight"], 2), str(cl["prompt"]), str(cl["output"]), str(cl["requests"])});
  }
  out << "\nPipelines:\n\n";
  for (const auto& p : r["pipelines"]) {
    out << "- " << str(p["name"]) << ": " << str(p["file"]);
    if (p["status"] == "ok") {
      out << " (" << str(p["pipeline"]) << ", " << str(at(p, {"model", "weights"}));
      if (const json& regions = at(p, {"model", "decode_regions"}); regions.is_string()) {
        out << ", decode regions " << str(regions);
      }
      out << ")";
    }
    out << "\n";
  }
  return out.str();
}

}  // namespace tessera::bench
