// The runner on the real model: every request of the trace comes back with its timings, in both
// arrival modes, and exact pipelines agree token for token on the trace.
#include <gtest/gtest.h>

#include "tessera/bench/report.h"
#include "tessera/bench/runner.h"
#include "test_util.h"

namespace tessera::bench {
namespace {

std::unique_ptr<Pipeline> pipeline(const nlohmann::json& cache, const nlohmann::json& scheduler) {
  PipelineSpec spec = default_pipeline_spec();
  spec.model = test::kStoriesF32;
  spec.backend = "cpu";
  for (auto [kind, value] : {std::pair{ComponentKind::cache, cache}, {ComponentKind::scheduler, scheduler}}) {
    ComponentSpec c;
    c.plugin = value["plugin"];
    value.erase("plugin");
    c.params = value;
    c.where = "test";
    spec.components[kind] = c;
  }
  return Pipeline::build(spec, test::plugins());
}

Workload workload(const std::string& arrival) {
  return parse_workload("requests: 10\nseed: 3\narrival: " + arrival +
                            "\nusers: {count: 2}\nsystem_prompt: {length: 20, share: 0.5}\n"
                            "classes:\n  - {name: a, prompt: [8, 40], output: [4, 12]}\n  - {name: b, prompt: 16, output: 20}\n",
                        "w.yaml");
}

TEST(Runner, KvPeakCountsRequestsThatFinishWithinTheirFirstStep) {
  // One output token: each request is admitted, prefilled and finished in one step, so its blocks
  // are free again by the time the step returns.
  auto p = pipeline({{"plugin", "paged"}, {"block_size", 16}, {"memory", "16MiB"}}, {{"plugin", "fcfs"}, {"max_seqs", 4}});
  const Workload w = parse_workload("requests: 4\narrival: {process: closed, concurrency: 2}\n"
                                    "classes:\n  - {name: a, prompt: 40, output: 1}\n", "w.yaml");
  const RunResult r = run_trace(*p, make_trace(w, p->tokenizer(), 512), w, {});
  EXPECT_GE(r.kv_blocks_peak, 3) << "40 prompt tokens in blocks of 16";
  EXPECT_GT(r.kv_bytes_peak, 0u);
}

TEST(Runner, ClosedLoopRunsEveryRequestToItsLength) {
  auto p = pipeline({{"plugin", "contiguous"}, {"max_seqs", 4}}, {{"plugin", "fcfs"}, {"max_seqs", 4}});
  const Workload w = workload("{process: closed, concurrency: 3}");
  const Trace t = make_trace(w, p->tokenizer(), 512);
  int64_t progress_calls = 0;
  const RunResult r = run_trace(*p, t, w, [&](int64_t done, int64_t total) {
    ++progress_calls;
    EXPECT_EQ(total, 10);
    EXPECT_EQ(done, progress_calls);
  });
  EXPECT_EQ(progress_calls, 10);
  ASSERT_EQ(r.results.size(), 10u);
  for (size_t i = 0; i < r.results.size(); ++i) {
    const GenerationResult& g = r.results[i];
    EXPECT_EQ(g.prompt, t.requests[i].prompt);
    EXPECT_EQ(int64_t(g.tokens.size()), t.requests[i].output_tokens);  // ignore_eos: the asked length
    EXPECT_EQ(g.reason, FinishReason::length);
    EXPECT_GT(g.first_token, g.submitted);
    EXPECT_GE(g.finished, g.first_token);
    EXPECT_GE(g.submitted, r.start);
    EXPECT_LE(g.finished, r.end);
  }
  EXPECT_LE(r.engine.peak_running, 3);  // never more than the clients
  EXPECT_GT(r.kv_bytes_peak, 0u);
  EXPECT_GT(r.seconds(), 0);
}

TEST(Runner, PoissonSubmitsNoRequestBeforeItsTimeAndPagedMatchesContiguous) {
  const Workload w = workload("{process: poisson, rate: 200}");
  auto contiguous = pipeline({{"plugin", "contiguous"}, {"max_seqs", 8}}, {{"plugin", "fcfs"}, {"max_seqs", 8}});
  const Trace t = make_trace(w, contiguous->tokenizer(), 512);
  PipelineRun a, b;
  a.run = run_trace(*contiguous, t, w);
  auto paged = pipeline({{"plugin", "paged"}, {"block_size", 16}, {"memory", "16MiB"}},
                        {{"plugin", "continuous"}, {"max_seqs", 8}, {"max_batch_tokens", 64}});
  b.run = run_trace(*paged, t, w);
  for (size_t i = 0; i < t.requests.size(); ++i) {
    EXPECT_GE(b.run.results[i].submitted + 1e-4, b.run.scheduled[i]) << i;
    EXPECT_NEAR(b.run.scheduled[i] - b.run.start, t.requests[i].arrival, 1e-9);
  }
  // Greedy, exact pipelines: the same tokens for every request of the trace.
  a.name = "contiguous";
  b.name = "paged";
  a.greedy = b.greedy = true;
  a.model = b.model = contiguous->model().config();
  const nlohmann::json m = pipeline_metrics(b, &a, t, w, nlohmann::json::object());
  EXPECT_EQ(m["accuracy"]["trace_agreement"], 1.0);
  EXPECT_EQ(m["accuracy"]["trace_identical_requests"], 10);
  EXPECT_EQ(m["requests"]["completed"], 10);
  EXPECT_TRUE(m.contains("submit_lag_ms"));
}

}  // namespace
}  // namespace tessera::bench
