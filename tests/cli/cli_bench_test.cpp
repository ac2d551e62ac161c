// `tessera bench` as a user runs it: the report's fields and ratios, Markdown and self-contained
// HTML, and the accuracy pass's shape when it cannot run.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <sstream>

#include "test_util.h"

namespace tessera {
namespace {

using test::Output;
using test::tessera_cmd;

// One small `tessera bench` run shared by the bench tests: two pipelines on stories260K, a tiny
// workload, and a pipeline file that does not exist (reported, not fatal).
struct BenchRun {
  test::TempDir dir;
  Output output;
  nlohmann::json report;
};

const BenchRun& bench_run() {
  static const std::unique_ptr<BenchRun> run = [] {
    auto r = std::make_unique<BenchRun>();
    const std::string workload = r->dir.write("tiny.yaml", test::kTinyBenchWorkload);
    r->output = tessera_cmd("bench --pipelines pipelines/baseline.yaml pipelines/paged.yaml '" + r->dir.path() +
                            "/missing.yaml' --workload '" + workload + "' --out '" + r->dir.path() +
                            "/out' --probe-seconds 0.05 --accuracy-text '" + test::kShared +
                            "/eval/tiny_stories_eval.txt' --accuracy-ctx 64 --accuracy-chunks 2 "
                            "--accuracy-prompts 2 --accuracy-tokens 8");
    std::ifstream in(r->dir.path() + "/out/report.json");
    if (in) r->report = nlohmann::json::parse(in, nullptr, false);
    return r;
  }();
  return *run;
}

const nlohmann::json& at_path(const nlohmann::json& j, const std::string& path) {
  static const nlohmann::json missing = "<missing>";
  const nlohmann::json* cur = &j;
  std::stringstream ss(path);
  std::string key;
  while (std::getline(ss, key, '.')) {
    if (!cur->is_object() || !cur->contains(key)) return missing;
    cur = &(*cur)[key];
  }
  return *cur;
}

TEST(CliBench, ReportsEveryFieldWithRatiosAgainstTheFirstPipeline) {
  const BenchRun& b = bench_run();
  // A pipeline that failed to load makes the exit status 2, after the report is written.
  ASSERT_EQ(b.output.status, 2) << b.output.text;
  ASSERT_TRUE(b.report.is_object()) << b.output.text;
  const nlohmann::json& r = b.report;
  EXPECT_EQ(r["reference"], "baseline");
  ASSERT_EQ(r["pipelines"].size(), 3u);
  for (const char* path :
       {"schema", "workload.name", "workload.trace.fingerprint", "workload.classes", "conditions.cpu.model",
        "conditions.cpu.cores", "conditions.threads", "conditions.memory_bytes", "conditions.backend",
        "conditions.device", "conditions.model.path", "conditions.model.weights", "conditions.lengths", "conditions.load",
        "conditions.build_type", "conditions.git_commit", "conditions.machine.read_bandwidth_gbs",
        "conditions.machine.fma_peak_gflops", "conditions.machine.core_round_trip_ns", "conditions.command",
        "five_questions.what_got_faster",
        "five_questions.under_which_conditions", "five_questions.for_which_request_classes",
        "five_questions.at_what_cost", "five_questions.reproduce"}) {
    EXPECT_NE(at_path(r, path), "<missing>") << path;
  }
  EXPECT_GT(at_path(r, "conditions.machine.read_bandwidth_gbs").get<double>(), 0.0);
  EXPECT_GT(at_path(r, "conditions.machine.fma_peak_gflops").get<double>(), 0.0);
  EXPECT_GE(at_path(r, "conditions.machine.core_round_trip_ns").get<double>(), 0.0);
  // The CPU backend's device names the instruction set its kernels use.
  EXPECT_NE(at_path(r, "conditions.device").get<std::string>().find("avx2"), std::string::npos) << r["conditions"];
  const nlohmann::json& base = r["pipelines"][0];
  const nlohmann::json& paged = r["pipelines"][1];
  for (const nlohmann::json* p : {&base, &paged}) {
    ASSERT_EQ((*p)["status"], "ok") << p->dump();
    for (const char* metric : {"ttft", "tpot", "itl", "e2e"}) {
      for (const char* stat : {"mean", "p50", "p95", "p99"}) {
        EXPECT_TRUE(at_path(*p, std::string("latency_ms.") + metric + "." + stat).is_number()) << metric << stat;
        EXPECT_TRUE(at_path(*p, std::string("ratios.") + metric + "_" + stat).is_number()) << metric << stat;
      }
    }
    for (const char* path :
         {"throughput.output_tokens_per_s", "throughput.requests_per_s", "memory.peak_rss_bytes",
          "memory.kv_bytes_total", "memory.kv_bytes_peak", "accuracy.perplexity", "accuracy.perplexity_delta",
          "accuracy.greedy_agreement", "accuracy.teacher_forced_agreement", "accuracy.trace_agreement",
          "accuracy.kl_divergence.mean", "accuracy.kl_divergence.p99", "accuracy.scored_tokens",
          "ratios.output_tokens_per_s", "ratios.peak_rss_bytes", "ratios.kv_bytes_total"}) {
      EXPECT_TRUE(at_path(*p, path).is_number()) << path << " in " << (*p)["name"];
    }
    // Present even where the pipeline cannot fill them: one shape for every report.
    EXPECT_TRUE((*p)["prefix"].contains("hit_rate"));
    EXPECT_TRUE((*p)["draft"]["acceptance"].is_null());
    EXPECT_EQ((*p)["requests"]["completed"], 6);
    EXPECT_EQ((*p)["model"]["decode_regions"], "per op") << "stories260K's weights are too small to share out";
    EXPECT_EQ((*p)["throughput"]["output_tokens"], r["workload"]["trace"]["output_tokens"]);
    EXPECT_TRUE((*p)["classes"].contains("short"));
    EXPECT_TRUE((*p)["users"].contains("user0"));
  }
  EXPECT_EQ(base["ratios"]["ttft_p50"], 1.0);
  EXPECT_NEAR(paged["ratios"]["ttft_p50"].get<double>(),
              paged["latency_ms"]["ttft"]["p50"].get<double>() / base["latency_ms"]["ttft"]["p50"].get<double>(), 1e-9);
  EXPECT_NEAR(paged["ratios"]["output_tokens_per_s"].get<double>(),
              paged["throughput"]["output_tokens_per_s"].get<double>() /
                  base["throughput"]["output_tokens_per_s"].get<double>(),
              1e-9);
  // paged + continuous is exact: same perplexity and the same greedy tokens as the baseline.
  EXPECT_NEAR(paged["accuracy"]["perplexity_delta"].get<double>(), 0.0, 1e-9);
  EXPECT_NEAR(paged["accuracy"]["kl_divergence"]["max"].get<double>(), 0.0, 1e-9);
  EXPECT_EQ(paged["accuracy"]["scored_tokens"], base["accuracy"]["scored_tokens"]);
  EXPECT_EQ(paged["accuracy"]["greedy_agreement"], 1.0);
  EXPECT_EQ(paged["accuracy"]["trace_agreement"], 1.0);
  // The missing pipeline is listed with why.
  EXPECT_EQ(r["pipelines"][2]["status"], "failed");
  EXPECT_EQ(r["pipelines"][2]["failed_stage"], "load");
  EXPECT_NE(r["pipelines"][2]["error"].get<std::string>().find("missing.yaml: pipeline file not found"), std::string::npos);
  EXPECT_NE(b.output.text.find("[3/3 missing] FAILED (load)"), std::string::npos) << b.output.text;
}

TEST(CliBench, AnAccuracyPassThatCannotRunLeavesEveryFigureNullWithTheReason) {
  test::TempDir dir;
  const std::string workload = dir.write("w.yaml", "requests: 2\narrival: { process: closed, concurrency: 2 }\n"
                                                   "prompts: { source: vocabulary }\n"
                                                   "classes: [{ name: a, prompt: 8, output: 4 }]\n");
  const Output o = tessera_cmd("bench -q --pipelines pipelines/baseline.yaml pipelines/int8.yaml --workload '" +
                               workload + "' --out '" + dir.path() + "/out' --probe-seconds 0.05 --accuracy-text '" +
                               test::kShared + "/eval/tiny_stories_eval.txt' --accuracy-ctx 600 --accuracy-prompts 1 " +
                               "--accuracy-tokens 4");
  ASSERT_EQ(o.status, 0) << o.text;
  std::ifstream in(dir.path() + "/out/report.json");
  const auto report = nlohmann::json::parse(in);
  for (const auto& p : report["pipelines"]) {
    const auto& a = p["accuracy"];
    SCOPED_TRACE(p["name"].get<std::string>() + ": " + a.dump());
    for (const char* key : {"perplexity", "perplexity_delta", "perplexity_delta_percent", "teacher_forced_agreement",
                            "kl_divergence", "scored_tokens"}) {
      ASSERT_TRUE(a.contains(key)) << key;
      EXPECT_TRUE(a[key].is_null()) << key;
    }
    EXPECT_EQ(a["perplexity_note"], "n/a: --accuracy-ctx 600 is longer than the model's context (512 tokens)");
    EXPECT_TRUE(a["greedy_agreement"].is_number());  // needs no text, so measured still
  }
  // Skipped, the pass leaves the same shape: every figure null, and a note saying why. A closed
  // loop's submission lag is null too, not left out.
  const Output skipped = tessera_cmd("bench -q --no-accuracy --pipelines pipelines/baseline.yaml pipelines/int8.yaml "
                                     "--workload '" + workload + "' --out '" + dir.path() + "/skipped' --probe-seconds 0.05");
  ASSERT_EQ(skipped.status, 0) << skipped.text;
  std::ifstream skipped_in(dir.path() + "/skipped/report.json");
  // Named: a range-for over a part of a temporary reads freed memory (the temporary dies first).
  const nlohmann::json skipped_report = nlohmann::json::parse(skipped_in);
  for (const auto& p : skipped_report.at("pipelines")) {
    const auto& a = p["accuracy"];
    SCOPED_TRACE(p["name"].get<std::string>() + ": " + p.dump());
    for (const char* key : {"perplexity", "perplexity_delta", "kl_divergence", "greedy_agreement", "scored_tokens"}) {
      ASSERT_TRUE(a.contains(key)) << key;
      EXPECT_TRUE(a[key].is_null()) << key;
    }
    EXPECT_NE(a["note"].get<std::string>().find("--no-accuracy"), std::string::npos);
    ASSERT_TRUE(p.contains("submit_lag_ms"));
    EXPECT_TRUE(p["submit_lag_ms"].is_null());
  }
}

TEST(CliBench, WritesMarkdownAndSelfContainedHtml) {
  const BenchRun& b = bench_run();
  const std::string out = b.dir.path() + "/out/";
  std::ifstream md_in(out + "report.md"), html_in(out + "report.html");
  ASSERT_TRUE(md_in && html_in) << b.output.text;
  std::stringstream md, html;
  md << md_in.rdbuf();
  html << html_in.rdbuf();
  EXPECT_NE(md.str().find("## Five questions"), std::string::npos);
  EXPECT_NE(md.str().find("| paged |"), std::string::npos);
  EXPECT_FALSE(std::regex_search(html.str(), std::regex("(src|href)\\s*=|https?://|@import|url\\(")));
  EXPECT_NE(html.str().find("TTFT CDF"), std::string::npos);
}

// Renders the HTML in headless Chromium (Debian's chromium package) and reads back the charts the
// page found drawn (every chart's marks laid out with a non-empty box).
TEST(CliBench, HeadlessChromiumDrawsEveryChart) {
  std::string chromium;
  for (const char* c : {"/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"}) {
    if (std::filesystem::exists(c)) {
      chromium = c;
      break;
    }
  }
  if (chromium.empty()) GTEST_SKIP() << "no chromium installed (apt-get install chromium)";
  const BenchRun& b = bench_run();
  const std::string html = b.dir.path() + "/out/report.html";
  ASSERT_TRUE(std::filesystem::exists(html)) << b.output.text;
  const std::string cmd = "'" + chromium + "' --headless --no-sandbox --disable-gpu --user-data-dir='" + b.dir.path() +
                          "/chromium' --dump-dom 'file://" + html + "' 2>/dev/null";
  std::string dom;
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) dom.append(buf.data(), n);
  pclose(pipe);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(dom, m, std::regex("<body data-charts-total=\"(\\d+)\" data-charts-drawn=\"(\\d+)\""))) << dom.substr(0, 500);
  EXPECT_EQ(m[1], "7");
  EXPECT_EQ(m[2], "7");
}

}  // namespace
}  // namespace tessera
