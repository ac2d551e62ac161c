// `tessera bench --server URL` end to end: the real `tessera serve` on a loopback port, the same
// trace run in-process and over streamed HTTP, and a server that cannot be reached.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "serve_test_util.h"

namespace tessera {
namespace {

using nlohmann::json;

using test::Output;
using test::tessera_cmd;

json read_report(const std::string& dir) {
  std::ifstream in(dir + "/report.json");
  return in ? json::parse(in, nullptr, false) : json();
}

std::string common_flags(const test::TempDir& dir, const std::string& out) {
  return "--workload '" + dir.write("tiny.yaml", test::kTinyBenchWorkload) + "' --out '" + dir.path() + "/" + out +
         "' --probe-seconds 0.05 --no-accuracy -q";
}

TEST(BenchServer, ServedPipelineMatchesTheInProcessOneOnTheSameTrace) {
  test::TempDir dir;
  const std::string pipeline = test::serve_pipeline(dir);
  test::ServerProcess server({"-p", pipeline});
  const std::string url = "http://127.0.0.1:" + std::to_string(server.port());
  // Token-id prompts: the server sees exactly the trace, so greedy outputs must be identical.
  const Output o = tessera_cmd("bench --pipelines '" + pipeline + "' --server " + url + " --server-token-prompts " +
                               common_flags(dir, "ids"));
  ASSERT_EQ(o.status, 0) << o.text << server.log();
  const json r = read_report(dir.path() + "/ids");
  ASSERT_TRUE(r.is_object()) << o.text;
  ASSERT_EQ(r["pipelines"].size(), 2u);
  EXPECT_EQ(r["reference"], "serve");
  const json& local = r["pipelines"][0];
  const json& served = r["pipelines"][1];
  EXPECT_EQ(served["name"], "127.0.0.1:" + std::to_string(server.port()));
  ASSERT_EQ(served["status"], "ok") << served.dump();
  EXPECT_EQ(served["server"]["url"], url);
  EXPECT_EQ(served["server"]["model"], "stories260K-f32");  // from GET /v1/models
  EXPECT_EQ(served["server"]["ignore_eos"], true);
  EXPECT_EQ(served["server"]["prompt_token_mismatches"], 0);
  EXPECT_EQ(served["requests"]["completed"], 6);
  EXPECT_EQ(served["requests"]["errors"], 0);
  // ignore_eos over HTTP: every request generates its max_tokens, counted from the usage block.
  EXPECT_EQ(served["throughput"]["output_tokens"], r["workload"]["trace"]["output_tokens"]);
  EXPECT_EQ(served["throughput"]["prompt_tokens"], local["throughput"]["prompt_tokens"]);
  for (const char* metric : {"ttft", "tpot", "e2e"}) {
    EXPECT_TRUE(served["latency_ms"][metric]["p50"].is_number()) << metric;
    EXPECT_TRUE(served["ratios"][std::string(metric) + "_p50"].is_number()) << metric;
  }
  EXPECT_GT(served["latency_ms"]["ttft"]["p50"].get<double>(), 0.0);
  EXPECT_GT(served["latency_ms"]["e2e"]["p50"].get<double>(), 0.0);
  // stories260K streams ~20k tokens/s: a short answer's tokens can all arrive in one read after
  // the first, and the client then measures a TPOT of 0 (what it saw, not an error).
  EXPECT_GE(served["latency_ms"]["tpot"]["p50"].get<double>(), 0.0);
  EXPECT_LE(served["latency_ms"]["ttft"]["p50"].get<double>(), served["latency_ms"]["e2e"]["p50"].get<double>());
  EXPECT_EQ(served["latency_ms"]["ttft"]["count"], 6);
  EXPECT_TRUE(served["classes"].contains("short"));
  EXPECT_TRUE(served["classes"].contains("long"));
  EXPECT_EQ(served["users"].size(), local["users"].size());
  // What HTTP cannot see is n/a; a tessera server's /metrics fills the KV pool size.
  EXPECT_TRUE(served["memory"]["peak_rss_bytes"].is_null());
  EXPECT_TRUE(served["ratios"]["peak_rss_bytes"].is_null());
  EXPECT_GT(served["memory"]["kv_blocks_total"].get<double>(), 0.0);
  EXPECT_GT(served["server"]["metrics"]["steps"].get<double>(), 0.0);
  // Greedy over HTTP equals greedy in-process, request for request.
  EXPECT_EQ(served["accuracy"]["trace_agreement_basis"], "text");
  EXPECT_EQ(served["accuracy"]["trace_compared_requests"], 6);
  EXPECT_EQ(served["accuracy"]["trace_identical_requests"], 6);
  EXPECT_EQ(served["accuracy"]["trace_agreement"], 1.0);

  // Text prompts (the default, for any server): the same trace decoded, re-tokenised by the server.
  const Output t = tessera_cmd("bench --server " + url + " -m '" + test::kStoriesF32 + "' " + common_flags(dir, "text"));
  ASSERT_EQ(t.status, 0) << t.text;
  const json rt = read_report(dir.path() + "/text");
  ASSERT_EQ(rt["pipelines"].size(), 1u);
  EXPECT_EQ(rt["pipelines"][0]["requests"]["completed"], 6);
  EXPECT_EQ(rt["pipelines"][0]["throughput"]["output_tokens"], rt["workload"]["trace"]["output_tokens"]);
  EXPECT_EQ(rt["workload"]["trace"]["fingerprint"], r["workload"]["trace"]["fingerprint"]);
  EXPECT_NE(rt["conditions"]["backend"].get<std::string>().find(url), std::string::npos);
  std::ifstream md(dir.path() + "/text/report.md");
  EXPECT_TRUE(md.good());
}

// Against a deployment with a canary, each request counts under the variant whose name came back in
// X-Tessera-Variant: a per-variant table in the report (JSON and Markdown).
TEST(BenchServer, ADeploymentsVariantsEachGetTheirOwnRow) {
  test::TempDir dir;
  test::serve_pipeline(dir, "", "stable.yaml");
  dir.write("canary.yaml", "extends: stable.yaml\ncomponents:\n  cache: { plugin: contiguous }\n");
  const std::string deploy = dir.write("deploy.yaml",
                                       "models:\n"
                                       "  - name: m\n"
                                       "    variants: [{ name: stable, pipeline: stable.yaml, weight: 1 },\n"
                                       "               { name: canary, pipeline: canary.yaml, weight: 1 }]\n");
  test::ServerProcess server({"-d", deploy});
  const std::string workload = dir.write("users.yaml",
                                         "name: users\nrequests: 16\nseed: 3\narrival: { process: closed, concurrency: 4 }\n"
                                         "users: { count: 16 }\nprompts: { source: vocabulary }\n"
                                         "classes:\n  - { name: turn, weight: 1, prompt: [8, 16], output: 4 }\n");
  const Output o = tessera_cmd("bench --server http://127.0.0.1:" + std::to_string(server.port()) + " --server-model m -m '" +
                               test::kStoriesF32 + "' --workload '" + workload + "' --out '" + dir.path() +
                               "/v' --probe-seconds 0.05 --no-accuracy -q");
  ASSERT_EQ(o.status, 0) << o.text << server.log();
  const json r = read_report(dir.path() + "/v");
  const json& variants = r["pipelines"][0]["variants"];
  ASSERT_TRUE(variants.contains("stable")) << variants.dump();
  ASSERT_TRUE(variants.contains("canary")) << variants.dump();
  EXPECT_EQ(variants.size(), 2u) << variants.dump();
  EXPECT_EQ(variants["stable"]["count"].get<int>() + variants["canary"]["count"].get<int>(), 16);
  for (const char* v : {"stable", "canary"}) {
    EXPECT_EQ(variants[v]["errors"], 0);
    EXPECT_GT(variants[v]["latency_ms"]["ttft"]["p50"].get<double>(), 0.0) << v;
  }
  std::ifstream md(dir.path() + "/v/report.md");
  std::stringstream text;
  text << md.rdbuf();
  EXPECT_NE(text.str().find("## Per variant"), std::string::npos);
  EXPECT_NE(text.str().find("| canary |"), std::string::npos) << text.str();
}

TEST(BenchServer, UnreachableServerIsReportedWithExitStatusTwo) {
  test::TempDir dir;
  const Output o = tessera_cmd("bench --server http://127.0.0.1:1 -m '" + std::string(test::kStoriesF32) + "' " +
                               common_flags(dir, "out"));
  EXPECT_EQ(o.status, 2) << o.text;
  const json r = read_report(dir.path() + "/out");
  ASSERT_TRUE(r.is_object()) << o.text;
  ASSERT_EQ(r["pipelines"].size(), 1u);
  EXPECT_EQ(r["pipelines"][0]["status"], "failed");
  EXPECT_EQ(r["pipelines"][0]["failed_stage"], "connect");
  EXPECT_NE(r["pipelines"][0]["error"].get<std::string>().find("cannot reach http://127.0.0.1:1"), std::string::npos)
      << r["pipelines"][0].dump();
  EXPECT_NE(o.text.find("no pipeline or server ran"), std::string::npos) << o.text;
}

TEST(BenchServer, ServerRefusingRequestsIsReportedNotFatal) {
  test::TempDir dir;
  const std::string pipeline = test::serve_pipeline(dir);
  test::ServerProcess server({"-p", pipeline, "--api-key", "s3cret"});
  const std::string url = "http://127.0.0.1:" + std::to_string(server.port());
  // No key: the 401 is reported for that column, and the pipeline column still runs.
  const Output o = tessera_cmd("bench --pipelines '" + pipeline + "' --server " + url + " " + common_flags(dir, "out"));
  EXPECT_EQ(o.status, 2) << o.text;
  const json r = read_report(dir.path() + "/out");
  ASSERT_EQ(r["pipelines"].size(), 2u) << o.text;
  EXPECT_EQ(r["pipelines"][0]["status"], "ok");
  EXPECT_EQ(r["pipelines"][1]["status"], "failed");
  EXPECT_NE(r["pipelines"][1]["error"].get<std::string>().find("HTTP 401"), std::string::npos) << r["pipelines"][1].dump();
  // With the key it runs.
  const Output k = tessera_cmd("bench --server " + url + " --api-key s3cret --server-model stories260K-f32 -m '" +
                               std::string(test::kStoriesF32) + "' " + common_flags(dir, "keyed"));
  EXPECT_EQ(k.status, 0) << k.text;
  EXPECT_EQ(read_report(dir.path() + "/keyed")["pipelines"][0]["requests"]["completed"], 6);
}

}  // namespace
}  // namespace tessera
