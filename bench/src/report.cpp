// The report document: workload, conditions, per-pipeline figures with ratios against the
// reference, and the five questions answered from those figures.
#include <cmath>
#include <sstream>

#include "tessera/bench/report.h"

namespace tessera::bench {

namespace {

using nlohmann::json;

// Differences smaller than this are called "no change": one run on a shared machine is noisy.
constexpr double kNoise = 0.05;

std::string fmt(double v, int digits = 2) {
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(digits);
  s << v;
  return s.str();
}

std::string times(const json& ratio) { return ratio.is_number() ? "x" + fmt(ratio.get<double>()) : "n/a"; }

struct Change {
  std::string label;
  const char* key;
  bool lower_is_better;
};
const std::vector<Change>& speed_changes() {
  static const std::vector<Change> c = {
      {"output tokens/s", "output_tokens_per_s", false}, {"requests/s", "requests_per_s", false},
      {"TTFT P50", "ttft_p50", true},                    {"TTFT P95", "ttft_p95", true},
      {"TTFT P99", "ttft_p99", true},                    {"TPOT P50", "tpot_p50", true},
      {"TPOT P95", "tpot_p95", true},                    {"E2E P50", "e2e_p50", true},
      {"E2E P95", "e2e_p95", true},
  };
  return c;
}

json what_got_faster(const json& pipelines, const std::string& ref) {
  json out = json::array();
  for (const auto& p : pipelines) {
    if (p["status"] != "ok" || p["name"] == ref) continue;
    std::string faster, slower;
    for (const auto& c : speed_changes()) {
      const json& r = p["ratios"][c.key];
      if (!r.is_number()) continue;
      const double v = r.get<double>();
      const bool better = c.lower_is_better ? v < 1 - kNoise : v > 1 + kNoise;
      const bool worse = c.lower_is_better ? v > 1 + kNoise : v < 1 - kNoise;
      std::string& into = better ? faster : slower;
      if (better || worse) into += (into.empty() ? "" : ", ") + c.label + " " + times(r);
    }
    std::string line = p["name"].get<std::string>() + " vs " + ref + ": ";
    line += faster.empty() ? "nothing faster beyond ±5%" : "faster: " + faster;
    if (!slower.empty()) line += "; slower: " + slower;
    out.push_back(line);
  }
  if (out.empty()) out.push_back("only one pipeline ran: nothing to compare");
  return out;
}

json for_which_classes(const json& pipelines, const std::string& ref_name) {
  json out = json::array();
  const json* ref = nullptr;
  for (const auto& p : pipelines) {
    if (p["name"] == ref_name) ref = &p;
  }
  if (ref == nullptr) return out;
  auto ratio = [](const json& a, const json& b) -> json {
    if (!a.is_number() || !b.is_number() || b.get<double>() == 0) return nullptr;
    return a.get<double>() / b.get<double>();
  };
  for (const auto& p : pipelines) {
    if (p["status"] != "ok" || p["name"] == ref_name) continue;
    std::string line = p["name"].get<std::string>() + ":";
    std::string best;
    double best_gain = 1e300;
    for (const auto& [cls, c] : p["classes"].items()) {
      if (!(*ref)["classes"].contains(cls)) continue;
      const json& rc = (*ref)["classes"][cls]["latency_ms"];
      const json e2e = ratio(c["latency_ms"]["e2e"]["p50"], rc["e2e"]["p50"]);
      const json ttft = ratio(c["latency_ms"]["ttft"]["p95"], rc["ttft"]["p95"]);
      line += " " + cls + " E2E P50 " + times(e2e) + ", TTFT P95 " + times(ttft) + ";";
      if (e2e.is_number() && e2e.get<double>() < best_gain) {
        best_gain = e2e.get<double>();
        best = cls;
      }
    }
    if (!best.empty()) {
      line += best_gain < 1 - kNoise ? " most gained: " + best
              : best_gain > 1 + kNoise ? " every class slower end to end"
                                       : " no class changed beyond ±5% end to end";
    }
    out.push_back(line);
  }
  return out;
}

json at_what_cost(const json& pipelines, const std::string& ref) {
  json out = json::array();
  for (const auto& p : pipelines) {
    if (p["status"] != "ok" || p["name"] == ref) continue;
    std::string line = p["name"].get<std::string>() + ": peak RSS " + times(p["ratios"]["peak_rss_bytes"]) +
                       ", KV pool " + times(p["ratios"]["kv_bytes_total"]) + ", KV peak in use " +
                       times(p["ratios"]["kv_bytes_peak"]) + ", weights " + times(p["ratios"]["weight_bytes"]);
    const json& a = p["accuracy"];
    if (a.contains("perplexity_delta_percent") && a["perplexity_delta_percent"].is_number()) {
      line += "; perplexity " + fmt(a["perplexity"].get<double>(), 3) + " (" +
              (a["perplexity_delta_percent"].get<double>() >= 0 ? "+" : "") +
              fmt(a["perplexity_delta_percent"].get<double>()) + "%)";
    }
    if (a.contains("kl_divergence") && a["kl_divergence"].is_object()) {
      line += ", KL divergence " + fmt(a["kl_divergence"]["mean"].get<double>(), 4) + " nats a token";
    }
    if (a.contains("greedy_agreement") && a["greedy_agreement"].is_number()) {
      line += ", greedy agreement " + fmt(a["greedy_agreement"].get<double>(), 3);
    }
    if (a.contains("trace_agreement") && a["trace_agreement"].is_number()) {
      line += ", trace agreement " + fmt(a["trace_agreement"].get<double>(), 3) + " (" +
              std::to_string(a.value("trace_identical_requests", 0)) + "/" +
              std::to_string(a.value("trace_compared_requests", 0)) + " requests identical)";
    }
    out.push_back(line);
  }
  return out;
}

std::string conditions_line(const json& w, const json& c) {
  std::ostringstream s;
  s << "workload '" << w["name"].get<std::string>() << "' (" << w["requests"] << " requests, "
    << w["arrival"]["description"].get<std::string>() << ", " << w["users"]["count"] << " users, classes:";
  for (const auto& cls : w["classes"]) {
    s << " " << cls["name"].get<std::string>() << " " << cls["prompt"].get<std::string>() << " in / "
      << cls["output"].get<std::string>() << " out";
  }
  if (w["system_prompt"]["length"].get<int64_t>() > 0) {
    s << "; system prompt " << w["system_prompt"]["length"] << " tokens on " << fmt(w["system_prompt"]["share"].get<double>() * 100, 0)
      << "% of requests, " << w["system_prompt"]["scope"].get<std::string>();
  }
  s << ") on " << c["cpu"]["model"].get<std::string>() << ", " << c["threads"] << " threads, "
    << c["backend"].get<std::string>() << " backend (" << c.value("device", std::string("?")) << "), model " << c["model"]["name"].get<std::string>() << " ("
    << c["model"]["weights"].get<std::string>() << ", context " << c["model"]["context"] << "), " << c["build_type"].get<std::string>()
    << " build at " << c["git_commit"].get<std::string>();
  return s.str();
}

}  // namespace

json workload_json(const Workload& w, const Trace& trace) {
  json classes = json::array();
  std::vector<int64_t> counts(w.classes.size(), 0);
  for (const auto& r : trace.requests) ++counts[size_t(r.klass)];
  for (size_t i = 0; i < w.classes.size(); ++i) {
    const auto& c = w.classes[i];
    classes.push_back({{"name", c.name}, {"weight", c.weight}, {"prompt", c.prompt.describe()},
                       {"output", c.output.describe()}, {"requests", counts[i]}});
  }
  json arrival = {{"process", w.arrival.process == Arrival::Process::poisson ? "poisson" : "closed"},
                  {"description", w.arrival.describe()}};
  if (w.arrival.process == Arrival::Process::poisson) {
    arrival["rate"] = w.arrival.rate;
  } else {
    arrival["concurrency"] = w.arrival.concurrency;
  }
  char fp[17];
  std::snprintf(fp, sizeof fp, "%016llx", static_cast<unsigned long long>(trace.fingerprint));
  return {{"name", w.name},
          {"file", w.path},
          {"description", w.description},
          {"requests", w.requests},
          {"seed", w.seed},
          {"arrival", arrival},
          {"users", {{"count", w.users.count}, {"distribution", w.users.zipf ? "zipf" : "uniform"}, {"s", w.users.s}}},
          {"system_prompt",
           {{"length", w.system.length}, {"share", w.system.share}, {"scope", scope_name(w.system.scope)}}},
          {"prompts", w.prompts.from_file ? "file " + w.prompts.path : std::string("vocabulary")},
          {"context_policy", w.context == ContextPolicy::clamp ? "clamp" : "reject"},
          {"ignore_eos", w.ignore_eos},
          {"classes", classes},
          {"trace",
           {{"fingerprint", fp},
            {"prompt_tokens", trace.prompt_tokens},
            {"output_tokens", trace.output_tokens},
            {"clamped_requests", trace.clamped},
            {"context", trace.context}}}};
}

json make_report(const std::vector<PipelineRun>& runs, const Trace& trace, const Workload& workload,
                 const json& conditions) {
  const PipelineRun* ref = nullptr;
  for (const auto& r : runs) {
    if (r.ok()) {
      ref = &r;
      break;
    }
  }
  json report = {{"schema", "tessera-bench/1"}, {"workload", workload_json(workload, trace)}, {"conditions", conditions}};
  const json machine = conditions.contains("machine") ? conditions["machine"] : json::object();
  json pipelines = json::array();
  for (const auto& r : runs) pipelines.push_back(pipeline_metrics(r, ref, trace, workload, machine));
  std::string ref_name;
  if (ref != nullptr) {
    ref_name = ref->name;
    json ref_metrics;
    for (const auto& p : pipelines) {
      if (p["name"] == ref_name) ref_metrics = p;
    }
    for (auto& p : pipelines) {
      if (p["status"] == "ok") p["ratios"] = ratios(p, ref_metrics);
    }
  }
  report["reference"] = ref_name.empty() ? json(nullptr) : json(ref_name);
  if (!runs.empty() && ref != &runs.front()) {
    report["reference_note"] = ref == nullptr ? "no pipeline ran"
                                              : "the first pipeline (" + runs.front().name + ") failed; ratios are against " +
                                                    ref_name + ", the first that ran";
  }
  report["pipelines"] = pipelines;
  json failed = json::array();
  for (const auto& p : pipelines) {
    if (p["status"] != "ok") failed.push_back({{"name", p["name"]}, {"stage", p["failed_stage"]}, {"error", p["error"]}});
  }
  report["failed"] = failed;
  const std::string command = conditions.value("command", "");
  report["five_questions"] = {
      {"what_got_faster", what_got_faster(pipelines, ref_name)},
      {"under_which_conditions",
       conditions.contains("cpu") && conditions.contains("model") ? conditions_line(report["workload"], conditions) : ""},
      {"for_which_request_classes", for_which_classes(pipelines, ref_name)},
      {"at_what_cost", at_what_cost(pipelines, ref_name)},
      {"reproduce", command + (conditions.contains("git_commit")
                                   ? "   # at commit " + conditions["git_commit"].get<std::string>()
                                   : std::string())}};
  report["noise_threshold"] = kNoise;
  return report;
}

}  // namespace tessera::bench
