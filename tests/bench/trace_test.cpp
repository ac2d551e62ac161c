// Traces: the same seed gives the same trace; lengths, users, system prompts and arrivals follow
// the workload.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "tessera/bench/trace.h"
#include "tessera/error.h"
#include "tessera/synth.h"
#include "tessera/tokenizer.h"
#include "test_util.h"

namespace tessera::bench {
namespace {

const Tokenizer& tokenizer() {
  static const std::unique_ptr<Tokenizer> tok = Tokenizer::create(synth_vocabulary(512));
  return *tok;
}

Workload workload(const std::string& extra = "", int64_t requests = 200, double rate = 4) {
  return parse_workload("requests: " + std::to_string(requests) + "\nseed: 7\narrival: { process: poisson, rate: " +
                            std::to_string(rate) + " }\nusers: { count: 5, distribution: zipf, s: 1.2 }\n" + extra +
                            "classes:\n  - { name: chat, weight: 3, prompt: [10, 40], output: [5, 20] }\n"
                            "  - { name: code, weight: 1, prompt: { mean: 30, stddev: 5, min: 20, max: 40 }, output: 50 }\n",
                        "w.yaml");
}

TEST(Trace, SameSeedSameTrace) {
  const Trace a = make_trace(workload(), tokenizer(), 512);
  const Trace b = make_trace(workload(), tokenizer(), 512);
  ASSERT_EQ(a.requests.size(), 200u);
  EXPECT_EQ(a.fingerprint, b.fingerprint);
  for (size_t i = 0; i < a.requests.size(); ++i) {
    EXPECT_EQ(a.requests[i].prompt, b.requests[i].prompt);
    EXPECT_EQ(a.requests[i].arrival, b.requests[i].arrival);
    EXPECT_EQ(a.requests[i].output_tokens, b.requests[i].output_tokens);
    EXPECT_EQ(a.requests[i].user, b.requests[i].user);
  }
  Workload other = workload();
  other.seed = 8;
  EXPECT_NE(make_trace(other, tokenizer(), 512).fingerprint, a.fingerprint);
}

TEST(Trace, ChangingTheRateChangesOnlyTheArrivals) {
  const Trace slow = make_trace(workload("", 200, 4), tokenizer(), 512);
  const Trace fast = make_trace(workload("", 200, 8), tokenizer(), 512);
  for (size_t i = 0; i < slow.requests.size(); ++i) {
    EXPECT_EQ(slow.requests[i].prompt, fast.requests[i].prompt);
    EXPECT_EQ(slow.requests[i].klass, fast.requests[i].klass);
    EXPECT_NEAR(slow.requests[i].arrival, 2 * fast.requests[i].arrival, 1e-9);
  }
}

TEST(Trace, FollowsTheDistributions) {
  const Trace t = make_trace(workload("", 2000), tokenizer(), 512);
  std::map<int, int> per_class, per_user;
  for (const auto& r : t.requests) {
    ++per_class[r.klass];
    ++per_user[r.user];
    EXPECT_EQ(int64_t(r.prompt.size()), 1 + r.prompt_tokens);
    EXPECT_EQ(r.prompt.front(), tokenizer().bos());
    if (r.klass == 0) {
      EXPECT_GE(r.prompt_tokens, 10);
      EXPECT_LE(r.prompt_tokens, 40);
      EXPECT_GE(r.output_tokens, 5);
      EXPECT_LE(r.output_tokens, 20);
    } else {
      EXPECT_GE(r.prompt_tokens, 20);
      EXPECT_LE(r.prompt_tokens, 40);
      EXPECT_EQ(r.output_tokens, 50);
    }
    for (size_t k = 1; k < r.prompt.size(); ++k) {
      EXPECT_EQ(tokenizer().vocabulary().types[size_t(r.prompt[k])], kTokenNormal);
    }
  }
  EXPECT_NEAR(per_class[0] / 2000.0, 0.75, 0.03);
  // Zipf 1.2 over 5 users: user0 has 1 / (1 + 2^-1.2 + 3^-1.2 + 4^-1.2 + 5^-1.2) = 0.491 of requests.
  EXPECT_NEAR(per_user[0] / 2000.0, 0.491, 0.03);
  EXPECT_GT(per_user[0], per_user[1]);
  EXPECT_GT(per_user[1], per_user[4]);
  // Poisson at 4/s: the mean gap is 0.25 s.
  EXPECT_NEAR(t.requests.back().arrival / 2000.0, 0.25, 0.015);
}

TEST(Trace, SystemPromptsPerUserAreSharedWithinAUserOnly) {
  const Trace t = make_trace(workload("system_prompt: { length: 24, share: 0.5, scope: user }\n", 400), tokenizer(), 512);
  std::map<int32_t, std::vector<int32_t>> seen;
  int with = 0;
  for (const auto& r : t.requests) {
    if (r.system_tokens == 0) continue;
    ++with;
    const std::vector<int32_t> sys(r.prompt.begin() + 1, r.prompt.begin() + 25);
    if (seen.count(r.user)) EXPECT_EQ(seen[r.user], sys);
    seen[r.user] = sys;
  }
  EXPECT_NEAR(with / 400.0, 0.5, 0.07);
  ASSERT_EQ(seen.size(), 5u);
  EXPECT_NE(seen[0], seen[1]);
}

TEST(Trace, PromptTextComesFromTheFile) {
  test::TempDir dir;
  dir.write("t.txt", "Once upon a time, there was a little girl named Lily. She liked to play outside in the sun.");
  const Workload w = parse_workload("requests: 5\narrival: {process: closed, concurrency: 1}\nprompts: {path: t.txt}\n"
                                    "classes: [{name: a, prompt: 200, output: 4}]\n",
                                    dir.path() + "/w.yaml");
  const Trace t = make_trace(w, tokenizer(), 512);
  const std::vector<int32_t> text = tokenizer().encode(
      "Once upon a time, there was a little girl named Lily. She liked to play outside in the sun.", false);
  for (const auto& r : t.requests) {
    // A window of the file's tokens, wrapping around.
    ASSERT_EQ(r.prompt.size(), 201u);
    std::vector<int32_t> repeated;
    while (repeated.size() < 2 * r.prompt.size() + text.size()) repeated.insert(repeated.end(), text.begin(), text.end());
    EXPECT_NE(std::search(repeated.begin(), repeated.end(), r.prompt.begin() + 1, r.prompt.end()), repeated.end());
    EXPECT_EQ(r.arrival, 0);
  }
}

TEST(Trace, ClampCutsRequestsToTheContext) {
  Workload w = workload("context: clamp\n", 50);
  const Trace t = make_trace(w, tokenizer(), 48);
  EXPECT_GT(t.clamped, 0);
  for (const auto& r : t.requests) {
    EXPECT_LE(int64_t(r.prompt.size()) + r.output_tokens, 48);
    EXPECT_GE(r.output_tokens, 1);
  }
  w.context = ContextPolicy::reject;
  EXPECT_THROW(make_trace(w, tokenizer(), 48), Error);
}

}  // namespace
}  // namespace tessera::bench
