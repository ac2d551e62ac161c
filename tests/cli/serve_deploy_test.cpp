// `tessera serve -d`: several models in one server, weighted variants sticky per user with the
// variant in X-Tessera-Variant and the metrics, and the rollback guard taking a failing canary's
// traffic away after exactly min_requests requests. The guard's arithmetic in-process.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <iostream>
#include <thread>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "serve/rollback_guard.h"
#include "serve_test_util.h"

namespace tessera {
namespace {

using nlohmann::json;
using test::ServerProcess;

std::string variant_of(const httplib::Result& res) { return res ? res->get_header_value("X-Tessera-Variant") : "(none)"; }

httplib::Result complete(httplib::Client& c, const std::string& model, const std::string& user) {
  json body = {{"prompt", "Once upon a time"}, {"max_tokens", 4}, {"temperature", 0}};
  if (!model.empty()) body["model"] = model;
  if (!user.empty()) body["user"] = user;
  return c.Post("/v1/completions", body.dump(), "application/json");
}

TEST(ServeDeploy, ModelsAnswerByNameAndVariantsSplitByWeightStickyPerUser) {
  test::TempDir dir;
  const std::string a = test::serve_pipeline(dir, "", "a.yaml");
  dir.write("b.yaml", "extends: a.yaml\ncomponents:\n  cache: { plugin: contiguous }\n");
  const std::string deploy = dir.write("deploy.yaml",
                                       "models:\n"
                                       "  - name: stories\n"
                                       "    pipeline: a.yaml\n"
                                       "  - name: split\n"
                                       "    variants:\n"
                                       "      - { name: stable, pipeline: a.yaml, weight: 3 }\n"
                                       "      - { name: canary, pipeline: b.yaml, weight: 1 }\n"
                                       "      - { name: off, pipeline: b.yaml, weight: 0 }\n");
  ServerProcess server({"-d", deploy});
  httplib::Client c = server.client();

  auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  const json list = json::parse(models->body)["data"];
  ASSERT_EQ(list.size(), 2u) << models->body;
  EXPECT_EQ(list[0]["id"], "stories");
  EXPECT_EQ(list[1]["id"], "split");
  EXPECT_EQ(list[1]["variants"].size(), 3u);

  // A model by name; the first without one; an unknown one is a 400 naming the field.
  auto one = complete(c, "stories", "");
  ASSERT_TRUE(one);
  EXPECT_EQ(one->status, 200) << one->body;
  EXPECT_EQ(variant_of(one), "default");
  EXPECT_EQ(json::parse(one->body)["model"], "stories");
  const std::string text = json::parse(one->body)["choices"][0]["text"];
  EXPECT_EQ(variant_of(complete(c, "", "")), "default");
  auto unknown = complete(c, "gpt-5", "");
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 400);
  EXPECT_EQ(json::parse(unknown->body)["error"]["param"], "model") << unknown->body;

  // 3:1 by user; the weight-0 variant never; a user stays where it landed; both variants run the same
  // greedy model, so the text is the same whichever answers.
  std::map<std::string, std::string> landed;
  std::map<std::string, int> count;
  for (int u = 0; u < 160; ++u) {
    auto res = complete(c, "split", "user" + std::to_string(u));
    ASSERT_TRUE(res);
    ASSERT_EQ(res->status, 200) << res->body;
    EXPECT_EQ(json::parse(res->body)["choices"][0]["text"], text);
    landed["user" + std::to_string(u)] = variant_of(res);
    ++count[variant_of(res)];
  }
  EXPECT_EQ(count.count("off"), 0u);
  EXPECT_GT(count["canary"], 160 * 0.12) << count["canary"];
  EXPECT_LT(count["canary"], 160 * 0.40) << count["canary"];
  for (int u = 0; u < 40; ++u) {
    const std::string user = "user" + std::to_string(u);
    EXPECT_EQ(variant_of(complete(c, "split", user)), landed[user]) << user;
    ++count[landed[user]];
  }
  auto page = c.Get("/metrics");
  ASSERT_TRUE(page);
  EXPECT_EQ(test::metric(page->body, R"(tessera_variant_requests_total{model="split",variant="canary",status="200"})"),
            count["canary"]);
  EXPECT_EQ(test::metric(page->body, R"(tessera_variant_requests_total{model="split",variant="stable",status="200"})"),
            count["stable"]);
  EXPECT_EQ(test::metric(page->body, R"(tessera_variant_weight{model="split",variant="off"})"), 0);

  // A stream names its variant in the head too.
  auto stream = c.Post("/v1/completions",
                       json{{"model", "split"}, {"prompt", "Once"}, {"max_tokens", 2}, {"stream", true}, {"user", "user1"}}.dump(),
                       "application/json");
  ASSERT_TRUE(stream);
  EXPECT_EQ(variant_of(stream), landed["user1"]);
}

// A server for model 'm' with variants `stable` and `canary` (weights as given, YAML numbers) whose
// canary's decoder returns a token past the vocabulary (a test plugin): every request it serves fails
// (500). The guard rolls it back after 5 requests at more than 20% errors.
std::unique_ptr<ServerProcess> failing_canary_server(const test::TempDir& dir, const std::string& server_section,
                                                     const std::string& stable_weight, const std::string& canary_weight) {
  static const test::TempDir plugins;
  const std::string lib = plugins.path() + "/libtessera_testlib_broken.so";
  if (!std::filesystem::exists(lib)) {
    std::filesystem::copy_file(std::string(TESSERA_TEST_LIB_DIR) + "/libtestlib_broken_components.so", lib);
  }
  test::serve_pipeline(dir, "", "stable.yaml");
  dir.write("canary.yaml", "extends: stable.yaml\ncomponents:\n  decoder: { plugin: outside_vocabulary }\n");
  const std::string deploy = dir.write("deploy.yaml", server_section +
                                                          "models:\n"
                                                          "  - name: m\n"
                                                          "    variants:\n"
                                                          "      - { name: stable, pipeline: stable.yaml, weight: " +
                                                          stable_weight +
                                                          " }\n"
                                                          "      - { name: canary, pipeline: canary.yaml, weight: " +
                                                          canary_weight +
                                                          " }\n"
                                                          "    rollback: { min_requests: 5, window: 60, max_error_rate: 0.2 }\n");
  ::setenv("TESSERA_PLUGIN_PATH", plugins.path().c_str(), 1);
  auto server = std::make_unique<ServerProcess>(std::vector<std::string>{"-d", deploy});
  ::unsetenv("TESSERA_PLUGIN_PATH");
  return server;
}

TEST(ServeDeploy, AFailingCanaryLosesItsTrafficAfterMinRequests) {
  test::TempDir dir;
  auto owned = failing_canary_server(dir, "", "1", "1");
  ServerProcess& server = *owned;
  httplib::Client c = server.client();
  int canary = 0, failed = 0;
  for (int u = 0; u < 60; ++u) {
    auto res = complete(c, "m", "user" + std::to_string(u));
    ASSERT_TRUE(res);
    if (variant_of(res) == "canary") {
      ++canary;
      EXPECT_EQ(res->status, 500) << res->body;
    } else {
      EXPECT_EQ(res->status, 200) << res->body;
    }
    failed += res->status != 200;
  }
  EXPECT_EQ(canary, 5) << "requests are serial: the fifth failure trips the guard";
  EXPECT_EQ(failed, 5);
  EXPECT_NE(server.log().find("rollback: model 'm' variant 'canary' weight 1 -> 0: error rate 1.000 > 0.200 over 5 requests"),
            std::string::npos)
      << server.log();
  auto page = c.Get("/metrics");
  ASSERT_TRUE(page);
  EXPECT_EQ(test::metric(page->body, R"(tessera_rollbacks_total{model="m",variant="canary",reason="error_rate"})"), 1);
  EXPECT_EQ(test::metric(page->body, R"(tessera_variant_weight{model="m",variant="canary"})"), 0);
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200) << "a canary's failed requests do not fail the server";
}

// The admin API sets weights under its own key; a reload (POST /admin/reload, SIGHUP) brings new
// models in while 8 clients keep sending, and a bad file is refused by line with the old one serving:
// no client request fails or is dropped, and every engine's KV blocks come back.
TEST(ServeDeploy, AdminWeightsAndReloadsUnderLoadLoseNothing) {
  test::TempDir dir;
  test::serve_pipeline(dir, "", "a.yaml");
  dir.write("b.yaml", "extends: a.yaml\ncomponents:\n  cache: { plugin: contiguous }\n");
  auto deployment = [](const std::string& extra_model) {
    return "server: { admin_key: s3cret }\n"
           "models:\n"
           "  - name: m\n"
           "    variants:\n"
           "      - { name: stable, pipeline: a.yaml, weight: 1 }\n"
           "      - { name: canary, pipeline: b.yaml, weight: 0 }\n" +
           (extra_model.empty() ? "" : "  - name: " + extra_model + "\n    pipeline: b.yaml\n");
  };
  const std::string file = dir.write("deploy.yaml", deployment(""));
  ServerProcess server({"-d", file});
  httplib::Client c = server.client();
  const httplib::Headers admin = {{"Authorization", "Bearer s3cret"}};

  auto no_key = c.Get("/admin/deployment");
  ASSERT_TRUE(no_key);
  EXPECT_EQ(no_key->status, 401);
  auto wrong = c.Get("/admin/deployment", {{"Authorization", "Bearer guess"}});
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 401);
  auto state = c.Get("/admin/deployment", admin);
  ASSERT_TRUE(state);
  ASSERT_EQ(state->status, 200) << state->body;
  EXPECT_EQ(json::parse(state->body)["models"][0]["variants"][1]["weight"], 0.0) << state->body;

  // Promotion by hand: every user moves to the canary.
  const auto post = [&](const std::string& path, const json& body) { return c.Post(path, admin, body.dump(), "application/json"); };
  for (const auto& [body, status] : std::vector<std::pair<json, int>>{
           {{{"model", "m"}, {"weights", {{"nope", 1}}}}, 400},
           {{{"model", "m"}, {"weights", {{"stable", 0}}}}, 400},  // nothing left with traffic
           {{{"model", "x"}, {"weights", {{"stable", 1}}}}, 400},
           {{{"model", "m"}, {"weights", {{"canary", -1}}}}, 400},
           {{{"model", "m"}, {"weights", {{"canary", 1}, {"stable", 0}}}}, 200}}) {
    auto res = post("/admin/deployment", body);
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, status) << body.dump() << " => " << res->body;
  }
  for (int u = 0; u < 10; ++u) EXPECT_EQ(variant_of(complete(c, "m", "user" + std::to_string(u))), "canary");

  std::atomic<bool> stop{false};
  std::atomic<int> ok{0}, bad{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < 8; ++t) {
    clients.emplace_back([&, t] {
      httplib::Client mine = server.client();
      for (int i = 0; !stop; ++i) {
        auto res = complete(mine, "m", "client" + std::to_string(t) + "-" + std::to_string(i));
        (res && res->status == 200 ? ok : bad)++;
      }
    });
  }
  auto models = [&] {
    auto res = c.Get("/v1/models");
    std::set<std::string> ids;
    if (res && res->status == 200) {
      const json list = json::parse(res->body);
      for (const json& m : list["data"]) ids.insert(m["id"].get<std::string>());
    } else {
      ids.insert(res ? std::to_string(res->status) + " " + res->body : httplib::to_string(res.error()));
    }
    return ids;
  };
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  dir.write("deploy.yaml", deployment("m2"));
  auto reloaded = post("/admin/reload", json::object());
  ASSERT_TRUE(reloaded);
  EXPECT_EQ(reloaded->status, 200) << reloaded->body;
  EXPECT_EQ(models(), (std::set<std::string>{"m", "m2"}));
  EXPECT_EQ(variant_of(complete(c, "m2", "")), "default");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));

  dir.write("deploy.yaml", "models:\n  - name: m\n    pipline: a.yaml\n");
  auto refused = c.Post("/admin/reload", admin, "", "application/json");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 400);
  EXPECT_NE(refused->body.find("deploy.yaml:3: unknown key 'pipline'"), std::string::npos) << refused->body;
  EXPECT_EQ(models(), (std::set<std::string>{"m", "m2"}));

  dir.write("deploy.yaml", deployment("m3"));
  kill(server.pid(), SIGHUP);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (models().count("m3") == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(models(), (std::set<std::string>{"m", "m3"})) << server.log();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  stop = true;
  for (auto& t : clients) t.join();
  EXPECT_EQ(bad, 0);
  EXPECT_GT(ok, 16);
  // The reloaded file set the weights back: the stable variant serves again.
  EXPECT_EQ(variant_of(complete(c, "m", "user1")), "stable");
  auto page = c.Get("/metrics");
  ASSERT_TRUE(page);
  EXPECT_EQ(test::metric(page->body, "tessera_reloads_total"), 2);
  EXPECT_EQ(test::metric(page->body, "tessera_kv_blocks_used"), 0);
  EXPECT_EQ(server.stop(), 0) << server.log();
}

// Variants of one model file with the same backend and quantizer run on one load of its weights
// (reported per variant, with whom they share it); another quantizer loads its own.
TEST(ServeDeploy, VariantsOfOneModelFileShareOneLoadOfItsWeights) {
  test::TempDir dir;
  test::serve_pipeline(dir, "", "a.yaml");
  dir.write("b.yaml", "extends: a.yaml\ncomponents:\n  cache: { plugin: contiguous }\n");
  dir.write("c.yaml", "extends: a.yaml\ncomponents:\n  quantizer: { plugin: int8 }\n");
  const std::string file = dir.write("deploy.yaml",
                                     "server: { admin_key: k }\n"
                                     "models:\n"
                                     "  - name: m\n"
                                     "    variants: [{ name: a, pipeline: a.yaml }, { name: b, pipeline: b.yaml },\n"
                                     "               { name: c, pipeline: c.yaml }]\n");
  ServerProcess server({"-d", file});
  httplib::Client c = server.client();
  auto state = c.Get("/admin/deployment", {{"Authorization", "Bearer k"}});
  ASSERT_TRUE(state);
  ASSERT_EQ(state->status, 200) << state->body;
  const json v = json::parse(state->body)["models"][0]["variants"];
  EXPECT_EQ(v[0]["shares_weights_with"], json::array({"m/b"})) << state->body;
  EXPECT_EQ(v[1]["shares_weights_with"], json::array({"m/a"})) << state->body;
  EXPECT_EQ(v[2]["shares_weights_with"], json::array()) << state->body;
  EXPECT_EQ(v[0]["weight_bytes"], v[1]["weight_bytes"]);
  EXPECT_LT(v[2]["weight_bytes"].get<double>(), v[0]["weight_bytes"].get<double>()) << "int8 holds fewer bytes";
  for (int u = 0; u < 12; ++u) {
    auto res = complete(c, "m", "user" + std::to_string(u));
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 200) << res->body;
  }
  auto page = c.Get("/metrics");
  ASSERT_TRUE(page);
  EXPECT_EQ(test::metric(page->body, R"(tessera_variant_weight_bytes{model="m",variant="a"})"),
            v[0]["weight_bytes"].get<double>());
  EXPECT_EQ(server.stop(), 0) << server.log();
}

// The issue's load test: 64 clients sending throughout four reloads, with a canary whose every
// request fails (a test plugin's decoder) and which the guard rolls back in each deployment the
// reloads bring: no request is lost, none fails but the canary's own, and every KV block returns.
TEST(ServeDeploy, SixtyFourClientsThroughReloadsAndAFailingCanaryLoseNothing) {
  test::TempDir dir;
  auto owned = failing_canary_server(dir, "server: { admin_key: k }\n", "90", "10");
  ServerProcess& server = *owned;
  constexpr int kClients = 64, kReloads = 4;
  std::atomic<bool> stop{false};
  std::atomic<int> ok{0}, canary_errors{0}, lost{0}, other_errors{0};
  std::mutex first_mutex;
  std::string first_problem;
  std::vector<std::thread> clients;
  for (int t = 0; t < kClients; ++t) {
    clients.emplace_back([&, t] {
      httplib::Client mine = server.client();
      for (int i = 0; !stop; ++i) {
        auto res = complete(mine, "m", "client" + std::to_string(t) + "-" + std::to_string(i));
        if (res && res->status == 200) {
          ++ok;
          continue;
        }
        if (res && variant_of(res) == "canary") {
          ++canary_errors;
          continue;
        }
        ++(res ? other_errors : lost);
        std::lock_guard lock(first_mutex);
        if (first_problem.empty()) first_problem = res ? std::to_string(res->status) + " " + res->body : httplib::to_string(res.error());
      }
    });
  }
  httplib::Client c = server.client();
  // Each deployment runs until its guard has rolled the canary back and the clients have had another
  // 2 answers each, then the next reload: paced by the server, so a slow (sanitizer) build runs the
  // same test.
  auto canary_weight = [&] {
    auto page = c.Get("/metrics");
    return page ? test::metric(page->body, R"(tessera_variant_weight{model="m",variant="canary"})") : -1.0;
  };
  for (int r = 0; r <= kReloads; ++r) {
    const int answered = ok;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while ((canary_weight() != 0 || ok < answered + 2 * kClients) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    // EXPECT and break, not ASSERT: the client threads must be joined before the test returns.
    const bool rolled_back = canary_weight() == 0;
    EXPECT_TRUE(rolled_back) << "deployment " << r << ": the canary was not rolled back\n" << server.log();
    if (!rolled_back || r == kReloads) break;
    auto res = c.Post("/admin/reload", {{"Authorization", "Bearer k"}}, "", "application/json");
    const bool reloaded = res && res->status == 200;
    EXPECT_TRUE(reloaded) << (res ? res->body : httplib::to_string(res.error()));
    if (!reloaded) break;
    EXPECT_EQ(canary_weight(), 10) << "the new deployment's canary starts with the file's weight";
  }
  stop = true;
  for (auto& t : clients) t.join();
  std::cout << kClients << " clients, " << kReloads << " reloads: " << ok << " answered, " << canary_errors
            << " failed on the canary (" << kReloads + 1 << " deployments), " << other_errors << " other failures, "
            << lost << " lost\n";
  EXPECT_EQ(lost, 0) << first_problem;
  EXPECT_EQ(other_errors, 0) << first_problem;
  EXPECT_GE(ok, (kReloads + 1) * 2 * kClients);
  // Each deployment's canary fails min_requests requests, plus at most what the clients had in flight.
  EXPECT_GE(canary_errors, 5);
  EXPECT_LE(canary_errors, (kReloads + 1) * (5 + kClients));
  auto page = c.Get("/metrics");
  ASSERT_TRUE(page);
  EXPECT_EQ(test::metric(page->body, "tessera_reloads_total"), kReloads);
  EXPECT_EQ(test::metric(page->body, R"(tessera_variant_weight{model="m",variant="canary"})"), 0)
      << "the last deployment's canary was rolled back too";
  EXPECT_EQ(test::metric(page->body, "tessera_kv_blocks_used"), 0);
  EXPECT_EQ(server.stop(), 0) << server.log();
  const std::string log = server.log();
  size_t rollbacks = 0;
  for (size_t at = 0; (at = log.find("rollback: model 'm' variant 'canary'", at)) != std::string::npos; ++at) ++rollbacks;
  EXPECT_EQ(rollbacks, size_t(kReloads + 1)) << log;
}

// max_perplexity_delta: before the deployment takes traffic every variant is scored on eval_text; a
// canary further than the delta above the stable variant's perplexity starts with weight 0. On
// stories260K and the shared eval text: none 4.764, int8 4.792 (+0.028), int4 5.107 (+0.343).
TEST(ServeDeploy, ACanaryPastTheStablePerplexityStartsRolledBack) {
  test::TempDir dir;
  test::serve_pipeline(dir, "", "stable.yaml");
  dir.write("int8.yaml", "extends: stable.yaml\ncomponents:\n  quantizer: { plugin: int8 }\n");
  dir.write("int4.yaml", "extends: stable.yaml\ncomponents:\n  quantizer: { plugin: int4 }\n");
  const std::string file = dir.write("deploy.yaml",
                                     "server: { admin_key: k }\n"
                                     "models:\n"
                                     "  - name: m\n"
                                     "    variants: [{ name: stable, pipeline: stable.yaml }, { name: close, pipeline: int8.yaml },\n"
                                     "               { name: far, pipeline: int4.yaml }]\n"
                                     "    rollback: { max_perplexity_delta: 0.15, eval_text: " +
                                         test::kShared + "/eval/tiny_stories_eval.txt }\n");
  ServerProcess server({"-d", file});
  httplib::Client c = server.client();
  auto state = c.Get("/admin/deployment", {{"Authorization", "Bearer k"}});
  ASSERT_TRUE(state);
  ASSERT_EQ(state->status, 200) << state->body;
  const json v = json::parse(state->body)["models"][0]["variants"];
  EXPECT_NEAR(v[0]["perplexity"].get<double>(), 4.7637, 0.01) << state->body;
  EXPECT_EQ(v[1]["weight"], 1.0) << state->body;
  EXPECT_EQ(v[2]["weight"], 0.0) << state->body;
  EXPECT_EQ(v[2]["rollbacks"]["perplexity"], 1) << state->body;
  EXPECT_GT(v[2]["perplexity"].get<double>() - v[0]["perplexity"].get<double>(), 0.15);
  EXPECT_NE(server.log().find("rollback: model 'm' variant 'far' weight 1 -> 0: perplexity 5.1"), std::string::npos)
      << server.log();
  std::set<std::string> served;
  for (int u = 0; u < 30; ++u) {
    auto res = complete(c, "m", "user" + std::to_string(u));
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 200) << res->body;
    served.insert(variant_of(res));
  }
  EXPECT_EQ(served, (std::set<std::string>{"stable", "close"}));
  auto page = c.Get("/metrics");
  ASSERT_TRUE(page);
  EXPECT_EQ(test::metric(page->body, R"(tessera_rollbacks_total{model="m",variant="far",reason="perplexity"})"), 1);
  EXPECT_EQ(server.stop(), 0) << server.log();
}

TEST(ServeDeploy, WithoutAnAdminKeyTheAdminApiIsOff) {
  test::TempDir dir;
  ServerProcess server({"-p", test::serve_pipeline(dir)});
  httplib::Client c = server.client();
  auto res = c.Post("/admin/reload", "", "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 403);
  EXPECT_NE(res->body.find("server.admin_key"), std::string::npos) << res->body;
}

serve::Outcome at(double time, bool error, double ttft, double tpot = 0.01) { return {time, error, ttft, tpot}; }

TEST(RollbackGuard, ComparesP99LatencyWithTheStableVariantOnceBothHaveEnough) {
  RollbackSpec spec;
  spec.enabled = true;
  spec.min_requests = 10;
  spec.max_error_rate = 0.1;
  spec.max_ttft_p99_ratio = 2;
  spec.max_tpot_p99_ratio = 3;
  serve::OutcomeWindow stable, canary;
  for (int i = 0; i < 9; ++i) canary.add(at(i, false, 0.5));
  EXPECT_FALSE(serve::check_canary(spec, canary, stable)) << "nine canary requests: too few to judge";
  canary.add(at(9, false, 0.5));
  EXPECT_FALSE(serve::check_canary(spec, canary, stable)) << "no stable requests to compare latency with";
  for (int i = 0; i < 100; ++i) stable.add(at(i, false, i == 99 ? 0.3 : 0.1));
  // Nearest-rank P99 of 100 values is the 99th smallest: 0.1, so the canary's 0.5 is 5x.
  auto b = serve::check_canary(spec, canary, stable);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->reason, "ttft_p99");
  EXPECT_NE(b->detail.find("5.00x"), std::string::npos) << b->detail;
  spec.max_ttft_p99_ratio = 0;  // not checked
  EXPECT_FALSE(serve::check_canary(spec, canary, stable));
  canary.add(at(10, true, -1, -1));
  canary.add(at(11, true, -1, -1));  // 2 of 12 failed: 0.167 > 0.1
  b = serve::check_canary(spec, canary, stable);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->reason, "error_rate");
  canary.prune(11, 1.5);  // only t >= 9.5 stays: two requests, too few
  EXPECT_EQ(canary.size(), 2);
  EXPECT_FALSE(serve::check_canary(spec, canary, stable));
}

}  // namespace
}  // namespace tessera
