// The report from runs with known timings: figures, ratios against the first pipeline, a failed
// pipeline listed rather than dropped, and the Markdown/HTML renderings.
#include <gtest/gtest.h>

#include <regex>

#include "tessera/bench/report.h"
#include "tessera/synth.h"
#include "tessera/tokenizer.h"

namespace tessera::bench {
namespace {

using nlohmann::json;

// Request i is submitted at i, gets its first token `ttft` later and then one token every `gap`.
PipelineRun run(const std::string& name, const Trace& t, double ttft, double gap) {
  PipelineRun r;
  r.name = name;
  r.file = "pipelines/" + name + ".yaml";
  r.describe = "cpu | test";
  r.backend = "cpu";
  r.weight_bytes = 1000;
  r.peak_rss = 4 << 20;
  r.greedy = true;
  r.model.context_length = 512;
  for (const auto& tr : t.requests) {
    GenerationResult g;
    g.id = RequestId(tr.index + 1);
    g.prompt = tr.prompt;
    g.submitted = double(tr.index);
    g.admitted = g.submitted + ttft / 2;
    g.first_token = g.submitted + ttft;
    for (int64_t k = 0; k < tr.output_tokens; ++k) {
      g.tokens.push_back(int32_t(5 + k));
      g.token_times.push_back(g.first_token + gap * double(k));
    }
    g.finished = g.token_times.back();
    g.reason = FinishReason::length;
    r.run.results.push_back(g);
    r.run.scheduled.push_back(g.submitted);
    r.run.end = std::max(r.run.end, g.finished);
  }
  r.run.cache.bytes_total = 8 << 20;
  r.run.kv_bytes_peak = 1 << 20;
  return r;
}

struct Fixture {
  std::unique_ptr<Tokenizer> tok = Tokenizer::create(synth_vocabulary(300));
  Workload w = parse_workload("name: known\nrequests: 4\narrival: {process: closed, concurrency: 1}\n"
                              "classes: [{name: a, prompt: 8, output: 5}]\n",
                              "w.yaml");
  Trace t = make_trace(w, *tok, 512);
  json conditions = {{"cpu", {{"model", "Test CPU"}, {"cores", 2}, {"usable_cores", 2}}},
                     {"threads", 2},
                     {"memory_bytes", 1 << 30},
                     {"build_type", "Release"},
                     {"git_commit", "abc123"},
                     {"version", "0.1.0"},
                     {"compiler", "gcc"},
                     {"date", "2025-01-01T00:00:00Z"},
                     {"machine",
                      {{"read_bandwidth_gbs", 10.0},
                       {"fma_peak_gflops", 100.0},
                       {"core_round_trip_ns", 350.0},
                       {"core_round_trip_method", "ping-pong"}}},
                     {"backend", "cpu"},
                     {"model", {{"path", "m.gguf"}, {"name", "m"}, {"weights", "f32 x 1"}, {"context", 512}}},
                     {"command", "tessera bench --pipelines a.yaml b.yaml --workload w.yaml --out o"}};
};

TEST(Report, FiguresAndRatiosAgainstTheFirstPipeline) {
  Fixture f;
  std::vector<PipelineRun> runs = {run("slow", f.t, 0.2, 0.010), run("fast", f.t, 0.1, 0.005)};
  runs[1].run.cache.bytes_total = 16 << 20;
  const json r = make_report(runs, f.t, f.w, f.conditions);
  EXPECT_EQ(r["schema"], "tessera-bench/1");
  EXPECT_EQ(r["reference"], "slow");
  const json& slow = r["pipelines"][0];
  const json& fast = r["pipelines"][1];
  EXPECT_NEAR(slow["latency_ms"]["ttft"]["p50"].get<double>(), 200, 1e-6);
  EXPECT_NEAR(slow["latency_ms"]["tpot"]["mean"].get<double>(), 10, 1e-6);
  EXPECT_NEAR(slow["latency_ms"]["e2e"]["p99"].get<double>(), 240, 1e-6);
  EXPECT_EQ(slow["throughput"]["output_tokens"], 20);
  // 4 requests from t=0 to the last token at 3 + 0.2 + 0.04.
  EXPECT_NEAR(slow["throughput"]["requests_per_s"].get<double>(), 4 / 3.24, 1e-9);
  EXPECT_NEAR(fast["ratios"]["ttft_p50"].get<double>(), 0.5, 1e-9);
  EXPECT_NEAR(fast["ratios"]["tpot_p99"].get<double>(), 0.5, 1e-9);
  EXPECT_NEAR(fast["ratios"]["output_tokens_per_s"].get<double>(), 3.24 / 3.12, 1e-9);
  EXPECT_NEAR(fast["ratios"]["kv_bytes_total"].get<double>(), 2.0, 1e-9);
  EXPECT_EQ(slow["ratios"]["ttft_p95"], 1.0);
  EXPECT_TRUE(slow["draft"]["acceptance"].is_null());
  EXPECT_EQ(fast["accuracy"]["trace_agreement"], 1.0);
  EXPECT_EQ(fast["classes"]["a"]["count"], 4);
  EXPECT_EQ(fast["users"]["user0"]["count"], 4);
  EXPECT_NEAR(fast["machine_share"]["of_bandwidth"].get<double>(), fast["machine_share"]["weight_read_gbs"].get<double>() / 10, 1e-12);
  const json& q = r["five_questions"];
  EXPECT_NE(q["what_got_faster"][0].get<std::string>().find("fast vs slow: faster: "), std::string::npos);
  EXPECT_NE(q["what_got_faster"][0].get<std::string>().find("TTFT P50 x0.50"), std::string::npos);
  EXPECT_NE(q["at_what_cost"][0].get<std::string>().find("KV pool x2.00"), std::string::npos);
  EXPECT_NE(q["reproduce"].get<std::string>().find("tessera bench --pipelines a.yaml b.yaml"), std::string::npos);
  EXPECT_NE(q["under_which_conditions"].get<std::string>().find("Test CPU, 2 threads"), std::string::npos);
}

TEST(Report, AFailedFirstPipelineIsListedAndTheNextIsTheReference) {
  Fixture f;
  PipelineRun broken;
  broken.name = "broken";
  broken.file = "broken.yaml";
  broken.error = "broken.yaml:3: unknown cache plugin 'nope'";
  broken.failed_stage = "load";
  std::vector<PipelineRun> runs = {broken, run("a", f.t, 0.2, 0.01), run("b", f.t, 0.2, 0.01)};
  const json r = make_report(runs, f.t, f.w, f.conditions);
  EXPECT_EQ(r["reference"], "a");
  EXPECT_EQ(r["pipelines"][0]["status"], "failed");
  EXPECT_EQ(r["pipelines"][0]["error"], "broken.yaml:3: unknown cache plugin 'nope'");
  ASSERT_EQ(r["failed"].size(), 1u);
  EXPECT_EQ(r["failed"][0]["stage"], "load");
  EXPECT_NE(r["reference_note"].get<std::string>().find("failed"), std::string::npos);
  EXPECT_EQ(r["pipelines"][2]["ratios"]["ttft_p50"], 1.0);
  const std::string md = render_markdown(r);
  EXPECT_NE(md.find("## Failed pipelines"), std::string::npos);
  EXPECT_NE(md.find("unknown cache plugin 'nope'"), std::string::npos);
}

TEST(Report, MarkdownAndHtmlCarryEverySection) {
  Fixture f;
  std::vector<PipelineRun> runs = {run("base", f.t, 0.2, 0.01), run("x<y>", f.t, 0.1, 0.01)};
  const json r = make_report(runs, f.t, f.w, f.conditions);
  const std::string md = render_markdown(r);
  for (const char* s : {"## Five questions", "## Results", "## Ratios against base", "## Latency (ms)",
                        "## Per request class", "## Per user", "## Accuracy against base", "## Conditions",
                        "Test CPU", "abc123", "What got faster?", "Under which conditions?",
                        "For which request classes?", "At what cost", "How to reproduce it?",
                        "core-to-core round trip 350 ns (ping-pong)"}) {
    EXPECT_NE(md.find(s), std::string::npos) << s;
  }
  const std::string html = render_html(r);
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(html.find("350 ns (ping-pong)"), std::string::npos);
  EXPECT_NE(html.find("x&lt;y&gt;"), std::string::npos);  // names are escaped
  EXPECT_EQ(html.find("x<y>"), std::string::npos);
  // Self-contained: no URL, no external script, stylesheet or image.
  EXPECT_FALSE(std::regex_search(html, std::regex("(src|href)\\s*=|https?://|@import|url\\(")));
  size_t charts = 0;
  for (size_t at = html.find("<svg class=\"chart\""); at != std::string::npos; at = html.find("<svg class=\"chart\"", at + 1)) {
    ++charts;
  }
  EXPECT_EQ(charts, 7u);  // 3 CDFs, 2 throughput bars, memory, TTFT against load
}

}  // namespace
}  // namespace tessera::bench
