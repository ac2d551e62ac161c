// `tessera serve` under load (64 concurrent clients, 500 mixed requests) and with the official
// `openai` npm package as the client.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "serve_test_util.h"

namespace tessera {
namespace {

using nlohmann::json;
using test::ServerProcess;

const std::vector<std::string> kPrompts = {
    "Once upon a time", "Lily and Ben", "The cat sat on the mat", "One day, a little boy",
    "Tom had a red ball", "The sun was shining", "Sara wanted to fly", "In the park, there was",
};

struct Outcome {
  int status = 0;
  std::string text;
  std::string finish_reason;
  int64_t completion_tokens = -1;
  int64_t prompt_tokens = -1;
  bool done = true;
  double seconds = 0;
  std::string error;  // transport error, when there was no response
};

json load_body(size_t i, bool stream) {
  json b = {{"prompt", kPrompts[i % kPrompts.size()]},
            {"max_tokens", 8 + int(i % 3) * 8},  // 8, 16, 24
            {"user", "user" + std::to_string(i % 5)}};
  if (stream) b["stream"] = true;
  return b;
}

Outcome send(httplib::Client& c, const json& body) {
  Outcome o;
  const auto t0 = std::chrono::steady_clock::now();
  auto res = c.Post("/v1/completions", body.dump(), "application/json");
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!res) {
    o.error = httplib::to_string(res.error());
    return o;
  }
  o.status = res->status;
  if (res->status != 200) return o;
  if (body.value("stream", false)) {
    const auto s = test::parse_stream(res->body);
    o.text = s.text;
    o.finish_reason = s.finish_reason;
    o.done = s.done;
    if (s.usage.is_object()) {
      o.completion_tokens = s.usage["completion_tokens"];
      o.prompt_tokens = s.usage["prompt_tokens"];
    }
  } else {
    const json j = json::parse(res->body);
    o.text = j["choices"][0]["text"];
    o.finish_reason = j["choices"][0]["finish_reason"];
    o.completion_tokens = j["usage"]["completion_tokens"];
    o.prompt_tokens = j["usage"]["prompt_tokens"];
  }
  return o;
}

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(p * double(v.size() - 1) + 0.5))];
}

TEST(ServeLoad, SixtyFourClientsFiveHundredRequestsMatchSingleRequestsAndFreeTheCache) {
  constexpr int kClients = 64;
  constexpr size_t kRequests = 500;
  test::TempDir dir;
  ServerProcess server({"-p", test::serve_pipeline(dir, "  http_threads: 80\n  max_queue: 72\n")});

  // References: each distinct request alone, one at a time.
  std::map<std::pair<std::string, int>, Outcome> reference;
  {
    auto c = server.client();
    for (size_t i = 0; i < kPrompts.size() * 3; ++i) {
      const json b = load_body(i, false);
      const auto key = std::make_pair(b["prompt"].get<std::string>(), b["max_tokens"].get<int>());
      if (reference.count(key)) continue;
      reference[key] = send(c, b);
      ASSERT_EQ(reference[key].status, 200);
    }
  }

  std::vector<Outcome> outcomes(kRequests);
  std::atomic<size_t> next{0};
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> clients;
  for (int k = 0; k < kClients; ++k) {
    clients.emplace_back([&] {
      auto c = server.client();
      for (size_t i = next++; i < kRequests; i = next++) outcomes[i] = send(c, load_body(i, i % 2 == 1));
    });
  }
  for (auto& t : clients) t.join();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::vector<double> latencies;
  for (size_t i = 0; i < kRequests; ++i) {
    const json b = load_body(i, false);
    const Outcome& ref = reference.at({b["prompt"].get<std::string>(), b["max_tokens"].get<int>()});
    const Outcome& o = outcomes[i];
    ASSERT_EQ(o.status, 200) << "request " << i << ": " << o.error;
    EXPECT_TRUE(o.done) << "request " << i;
    EXPECT_EQ(o.text, ref.text) << "request " << i << " (" << (i % 2 ? "stream" : "whole") << ")";
    EXPECT_EQ(o.finish_reason, ref.finish_reason) << "request " << i;
    EXPECT_EQ(o.completion_tokens, ref.completion_tokens) << "request " << i;
    EXPECT_EQ(o.prompt_tokens, ref.prompt_tokens) << "request " << i;
    latencies.push_back(o.seconds);
  }
  std::printf("[load] %zu requests from %d clients in %.2f s: %.1f requests/s, latency p50 %.1f ms, p99 %.1f ms\n",
              kRequests, kClients, wall, double(kRequests) / wall, percentile(latencies, 0.5) * 1e3,
              percentile(latencies, 0.99) * 1e3);

  auto c = server.client();
  const std::string page = test::wait_for_metrics(c, [](const std::string& p) {
    return test::metric(p, "tessera_requests_in_flight") == 0 && test::metric(p, "tessera_requests_running") == 0;
  });
  EXPECT_EQ(test::metric(page, "tessera_kv_blocks_used"), 0) << page;
  EXPECT_EQ(test::metric(page, "tessera_kv_sequences"), 0) << page;
  EXPECT_EQ(test::metric(page, "tessera_queue_depth"), 0) << page;
  double ok = 0;
  for (int u = 0; u < 5; ++u) {
    ok += test::metric(page, "tessera_user_requests_total{user=\"user" + std::to_string(u) + "\",status=\"200\"}")
              .value_or(0);
  }
  EXPECT_EQ(ok, double(kRequests + reference.size()));
  EXPECT_EQ(server.stop(SIGTERM), 0) << server.log();
}

// The official client library, as deployments use it. Needs npm and access to its registry; skips
// (saying why) without them.
TEST(ServeOpenAiClient, TheOfficialNodePackageTalksToTheServer) {
  const std::string prefix = TESSERA_NPM_DIR;
  const std::string module = prefix + "/node_modules/openai/package.json";
  if (!std::filesystem::exists(module)) {
    if (std::system("command -v npm >/dev/null 2>&1 && command -v node >/dev/null 2>&1") != 0) {
      GTEST_SKIP() << "node/npm are not installed: the openai npm client test cannot run";
    }
    const std::string install = "mkdir -p '" + prefix + "' && timeout 300 npm install --no-save --no-audit --no-fund "
                                "--prefix '" + prefix + "' openai >'" + prefix + "/install.log' 2>&1";
    if (std::system(install.c_str()) != 0 || !std::filesystem::exists(module)) {
      GTEST_SKIP() << "cannot install the openai npm package (no network to the npm registry?): see "
                   << prefix << "/install.log";
    }
  }
  test::TempDir dir;
  ServerProcess server({"-p", test::serve_pipeline(dir), "--api-key", "node-key"});
  const std::string cmd = "NODE_PATH='" + prefix + "/node_modules' node '" TESSERA_SOURCE_DIR
                          "/tests/cli/openai_client_test.cjs' http://127.0.0.1:" + std::to_string(server.port()) +
                          "/v1 node-key stories260K-f32 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  const int status = pclose(pipe);
  EXPECT_EQ(WIFEXITED(status) ? WEXITSTATUS(status) : -1, 0) << out;
  EXPECT_NE(out.find("openai client: all checks passed"), std::string::npos) << out;
}

}  // namespace
}  // namespace tessera
