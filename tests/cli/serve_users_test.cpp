// `tessera serve` under many distinct `user` values (#51): per-user state, /metrics and latency stay
// flat. Before the fix every new user added prefix-cache state, a namespace and a /metrics series
// that lived forever (20,000 users: RSS 61 -> 349 MB, /metrics 26 KB -> 5.7 MB, 0.57 -> 16 ms).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <string>
#include <vector>

#include "serve_test_util.h"

namespace tessera {
namespace {

using nlohmann::json;
using test::ServerProcess;

int64_t rss_kib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

TEST(ServeUsers, DistinctUsersLeaveMemoryMetricsAndLatencyFlat) {
  test::TempDir dir;
  // A small pool (64 blocks of 16 tokens), so that eviction reaches steady state early; each request
  // caches two full blocks of its user's own.
  const std::string pipeline = dir.write(
      "users.yaml", "extends: " + std::string(TESSERA_SOURCE_DIR) + "/pipelines/prefix.yaml\nmodel: " +
                        test::kStoriesF32 + "\nbackend: cpu\ncomponents:\n  cache: { plugin: prefix_lru, memory: " +
                        std::to_string(64 * 16 * 1280) + " }\n");
  ServerProcess server({"-p", pipeline});
  httplib::Client c = server.client();
  c.set_keep_alive(true);
  c.set_tcp_nodelay(true);  // else Nagle holds the body for the server's delayed ACK: 40 ms a request
  const std::string prompt = "Once upon a time there was a little girl named Lily who loved to play in the park "
                             "with her friends every day";
  int next_user = 0;
  // Sends n requests from new users; returns the median latency in ms.
  auto new_users = [&](int n) {
    std::vector<double> ms;
    for (int i = 0; i < n; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      auto r = c.Post("/v1/completions",
                      json({{"prompt", prompt}, {"max_tokens", 1}, {"user", "u" + std::to_string(next_user++)}}).dump(),
                      "application/json");
      EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "no response");
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  };
  auto metrics_bytes = [&] {
    auto r = c.Get("/metrics");
    EXPECT_TRUE(r && r->status == 200);
    return r ? r->body.size() : size_t(0);
  };
  new_users(1200);  // past the 100 users with their own series (the server's and the cache's), and 1,000 idle ones
  const double ms_before = new_users(200);
  const size_t page_before = metrics_bytes();
  const int64_t rss_before = rss_kib(server.pid());
  new_users(2600);
  const double ms_after = new_users(200);
  const size_t page_after = metrics_bytes();
  const int64_t rss_after = rss_kib(server.pid());
  EXPECT_LE(page_after, page_before + 4096) << "/metrics grew from " << page_before << " to " << page_after
                                            << " bytes with 2,800 more users";
  EXPECT_LE(rss_after, rss_before + 8 * 1024) << "RSS grew from " << rss_before << " to " << rss_after << " KiB";
  EXPECT_LE(ms_after, 2 * ms_before + 2.0) << "median latency " << ms_before << " -> " << ms_after << " ms";
  auto page = c.Get("/metrics");
  ASSERT_TRUE(page);
  EXPECT_NE(page->body.find("tessera_user_prefix_cache_blocks{user=\"_other\"}"), std::string::npos);
  EXPECT_EQ(test::metric(page->body, "tessera_kv_blocks_used"), 0);
}

}  // namespace
}  // namespace tessera
