// cache: paged, through the real loader — what paging adds beyond the cache conformance suite:
// blocks taken on demand, sizing from `memory`, fragmentation, refusals without side effects, more
// short sequences than contiguous in the same memory, clear parameter errors, and the real model's
// greedy output unchanged when the pool is small enough to force preemption.
#include <gtest/gtest.h>
#include <gmock/gmock.h>

#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "tessera/cache.h"
#include "tessera/engine.h"
#include "tessera/error.h"
#include "tessera/registry.h"

namespace tessera {
namespace {

using nlohmann::json;
using test::cpu_backend;
using test::linear_forward;
using test::random_floats;
using testing::HasSubstr;

// stories260K: 5 layers, 4 kv heads, head_dim 8, context 512 -> 2*5*4*8*4 = 1280 bytes per token.
const CacheGeometry kStories{5, 4, 8, 512, DType::F32};
constexpr int64_t kBytesPerToken = 1280;

const Registry& registry() { return test::plugins(); }

std::shared_ptr<Cache> make(const json& params, const CacheGeometry& g = kStories) {
  auto c = registry().create<Cache>("paged", params, "test");
  c->configure(cpu_backend(), g);
  return c;
}

CacheRequest req(SeqId seq, int64_t total) {
  CacheRequest r;
  r.seq = seq;
  r.total_tokens = total;
  return r;
}

// plan + commit of one growth step; false if it did not fit.
bool grow(Cache& c, std::vector<CacheRequest> reqs) {
  auto plan = c.plan(reqs);
  if (!plan) return false;
  c.commit(*plan);
  return true;
}

std::vector<int32_t> table(const Cache& c, SeqId seq) {
  auto t = c.block_table(seq);
  return {t.begin(), t.end()};
}

TEST(CachePaged, MemoryDeterminesTheBlockCountExactly) {
  EXPECT_EQ(kStories.bytes_per_token(), size_t(kBytesPerToken));
  // 1MiB / (16 x 1280) = 51.2 -> 51 blocks.
  auto c = make({{"block_size", 16}, {"memory", "1MiB"}});
  CacheStats s = c->stats();
  EXPECT_EQ(s.block_size, 16);
  EXPECT_EQ(s.blocks_total, 51);
  EXPECT_EQ(s.blocks_used, 0);
  EXPECT_EQ(s.bytes_total, size_t(51 * 16 * kBytesPerToken));
  EXPECT_EQ(c->layer(0).num_blocks, 51);
  EXPECT_EQ(c->layer(0).block_size, 16);
  // Exactly 8 blocks of 8.
  EXPECT_EQ(make({{"block_size", 8}, {"memory", 8 * 8 * kBytesPerToken}})->stats().blocks_total, 8);
  EXPECT_EQ(make({{"block_size", 8}, {"memory", 8 * 8 * kBytesPerToken - 1}})->stats().blocks_total, 7);
  EXPECT_EQ(make({{"block_size", 32}, {"memory", "640KiB"}})->stats().blocks_total, 16);
}

TEST(CachePaged, MemoryShareTakesAShareOfTheDevice) {
  const size_t device = cpu_backend().devices().at(0).memory_bytes;
  ASSERT_GT(device, 0u);
  const double share = 1e-4;  // small enough to allocate in a test
  auto c = make({{"memory", 0}, {"memory_share", share}});
  const int64_t expected = int64_t(std::floor(share * double(device))) / (16 * kBytesPerToken);
  EXPECT_EQ(c->stats().blocks_total, expected);
}

TEST(CachePaged, BlocksAreTakenExactlyEveryBlockSizeTokens) {
  for (int64_t bs : {8, 16, 32}) {
    SCOPED_TRACE("block_size " + std::to_string(bs));
    auto c = make({{"block_size", bs}, {"memory", "1MiB"}});
    std::vector<int32_t> prev;
    for (int64_t n = 1; n <= 200; ++n) {
      ASSERT_TRUE(grow(*c, {req(1, n)}));
      c->mark_computed(1, n);
      const auto t = table(*c, 1);
      ASSERT_EQ(int64_t(t.size()), (n + bs - 1) / bs) << n << " tokens";
      ASSERT_TRUE(std::equal(prev.begin(), prev.end(), t.begin())) << "growth reordered the table";
      EXPECT_EQ(c->stats().blocks_used, int64_t(t.size()));
      EXPECT_EQ(c->stats().tokens_stored, n);
      prev = t;
    }
  }
}

TEST(CachePaged, ReportsFragmentation) {
  auto c = make({{"block_size", 16}, {"memory", "1MiB"}});
  ASSERT_TRUE(grow(*c, {req(1, 17)}));
  c->mark_computed(1, 17);
  CacheStats s = c->stats();
  EXPECT_EQ(s.blocks_used, 2);
  EXPECT_EQ(s.sequences, 1);
  EXPECT_EQ(s.slots_allocated, 32);
  EXPECT_EQ(s.tokens_stored, 17);
  EXPECT_EQ(s.slots_allocated - s.tokens_stored, 15) << "free slots in allocated blocks";
  EXPECT_DOUBLE_EQ(s.fragmentation(), 15.0 / 32.0);
  EXPECT_EQ(s.bytes_used, size_t(2 * 16 * kBytesPerToken));
  // Reserved but not yet computed: the slots count as allocated, unused.
  ASSERT_TRUE(grow(*c, {req(2, 16)}));
  s = c->stats();
  EXPECT_EQ(s.slots_allocated, 48);
  EXPECT_EQ(s.tokens_stored, 17);
  c->mark_computed(2, 16);
  EXPECT_DOUBLE_EQ(c->stats().fragmentation(), 15.0 / 48.0);
}

TEST(CachePaged, APlanThatDoesNotFitChangesNothing) {
  auto c = make({{"block_size", 16}, {"memory", 10 * 16 * kBytesPerToken}});  // 10 blocks
  ASSERT_TRUE(grow(*c, {req(1, 100)}));                                    // 7 blocks
  const CacheStats before = c->stats();
  const auto t1 = table(*c, 1);
  EXPECT_FALSE(c->plan(std::vector<CacheRequest>{req(2, 49)}).has_value()) << "4 blocks, 3 free";
  EXPECT_FALSE(c->plan(std::vector<CacheRequest>{req(1, 160), req(2, 1)}).has_value()) << "3 + 1 blocks, 3 free";
  EXPECT_FALSE(c->plan(std::vector<CacheRequest>{req(3, 513)}).has_value()) << "beyond the context";
  auto fits = c->plan(std::vector<CacheRequest>{req(2, 48)});
  ASSERT_TRUE(fits.has_value());
  EXPECT_EQ(fits->grants.at(0).new_blocks, 3);
  // Planning alone took nothing.
  const CacheStats after = c->stats();
  EXPECT_EQ(after.blocks_used, before.blocks_used);
  EXPECT_EQ(after.sequences, before.sequences);
  EXPECT_EQ(table(*c, 1), t1);
  EXPECT_TRUE(table(*c, 2).empty());
  c->commit(*fits);
  EXPECT_EQ(c->stats().blocks_used, 10);
}

TEST(CachePaged, ASequenceListedTwiceCountsOnceWithTheLargerTotal) {
  auto c = make({{"block_size", 16}, {"memory", 4 * 16 * kBytesPerToken}});  // 4 blocks
  auto plan = c->plan(std::vector<CacheRequest>{req(1, 20), req(1, 64)});
  ASSERT_TRUE(plan.has_value()) << "4 blocks, not 2 + 4";
  EXPECT_EQ(plan->grants[0].new_blocks + plan->grants[1].new_blocks, 4);
  c->commit(*plan);
  EXPECT_EQ(table(*c, 1).size(), 4u);
  EXPECT_EQ(c->stats().sequences, 1);
}

TEST(CachePaged, CommitOfAStalePlanThrowsAndChangesNothing) {
  auto c = make({{"block_size", 16}, {"memory", 4 * 16 * kBytesPerToken}});
  auto a = c->plan(std::vector<CacheRequest>{req(1, 48)});
  auto b = c->plan(std::vector<CacheRequest>{req(2, 48)});
  ASSERT_TRUE(a && b);
  c->commit(*a);
  try {
    c->commit(*b);
    ADD_FAILURE() << "a plan that no longer fits was committed";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("no longer fits"));
  }
  EXPECT_EQ(c->stats().blocks_used, 3);
  EXPECT_TRUE(table(*c, 2).empty());
}

TEST(CachePaged, InterleavedGrowthGivesDisjointBlocks) {
  auto c = make({{"block_size", 8}, {"memory", "1MiB"}});
  for (int64_t n = 1; n <= 100; ++n) {
    ASSERT_TRUE(grow(*c, {req(1, n), req(2, n + 5)}));
  }
  const auto t1 = table(*c, 1), t2 = table(*c, 2);
  EXPECT_EQ(t1.size(), 13u);
  EXPECT_EQ(t2.size(), 14u);
  std::set<int32_t> all(t1.begin(), t1.end());
  all.insert(t2.begin(), t2.end());
  EXPECT_EQ(all.size(), t1.size() + t2.size()) << "the sequences share a block";
  // Interleaved growth interleaves the blocks: neither sequence has a contiguous range.
  EXPECT_NE(t1.back() - t1.front(), int32_t(t1.size()) - 1);
}

TEST(CachePaged, ReleaseReturnsEveryBlock) {
  auto c = make({{"block_size", 16}, {"memory", 10 * 16 * kBytesPerToken}});
  ASSERT_TRUE(grow(*c, {req(1, 70), req(2, 33), req(3, 1)}));
  EXPECT_EQ(c->stats().blocks_used, 5 + 3 + 1);
  c->mark_computed(1, 70);
  c->release(1);
  EXPECT_TRUE(table(*c, 1).empty());
  EXPECT_EQ(c->stats().blocks_used, 4);
  EXPECT_EQ(c->stats().tokens_stored, 0);
  c->release(1);    // already gone: no-op
  c->release(999);  // never known: no-op
  c->release(2);
  c->release(3);
  const CacheStats s = c->stats();
  EXPECT_EQ(s.blocks_used, 0);
  EXPECT_EQ(s.sequences, 0);
  EXPECT_EQ(s.bytes_used, 0u);
  ASSERT_TRUE(grow(*c, {req(4, 160)})) << "the whole pool is free again";
  EXPECT_EQ(c->stats().blocks_used, 10);
}

TEST(CachePaged, MaxSeqsLimitsSequencesNotGrowth) {
  auto c = make({{"block_size", 16}, {"memory", "1MiB"}, {"max_seqs", 2}});
  ASSERT_TRUE(grow(*c, {req(1, 10), req(2, 10)}));
  EXPECT_FALSE(c->plan(std::vector<CacheRequest>{req(3, 1)}).has_value());
  EXPECT_TRUE(grow(*c, {req(1, 200), req(2, 100)}));
  c->release(1);
  EXPECT_TRUE(grow(*c, {req(3, 1)}));
}

// How many sequences of `tokens` tokens a cache takes before plan() refuses the next one.
int64_t capacity(Cache& c, int64_t tokens) {
  int64_t n = 0;
  while (n < 100000 && grow(c, {req(SeqId(1 + n), tokens)})) ++n;
  return n;
}

TEST(CachePaged, HoldsManyMoreShortSequencesThanContiguousInTheSameMemory) {
  // 1MiB: contiguous reserves 512 x 1280 bytes per sequence (1 sequence fits); paged takes 3 blocks
  // of 16 per 40-token sequence out of 51.
  auto paged = make({{"block_size", 16}, {"memory", "1MiB"}});
  auto contiguous = registry().create<Cache>("contiguous", json{{"memory", "1MiB"}, {"max_seqs", 0}}, "test");
  contiguous->configure(cpu_backend(), kStories);
  const int64_t p = capacity(*paged, 40), c = capacity(*contiguous, 40);
  EXPECT_EQ(c, 1);
  EXPECT_EQ(p, 17);
  EXPECT_GE(p, 10 * c);
}

// Returns the message of the Error thrown by `f`, or "" (with a failure) if none was.
template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error thrown";
  return "";
}

TEST(CachePaged, BadParametersAreNamed) {
  EXPECT_THAT(error_of([] { make({{"block_size", 0}}); }), HasSubstr("block_size"));
  EXPECT_THAT(error_of([] { make({{"block_size", 2048}}); }), HasSubstr("block_size"));
  const std::string units = error_of([] { make({{"memory", "12 parsecs"}}); });
  EXPECT_THAT(units, HasSubstr("memory"));
  EXPECT_THAT(units, HasSubstr("12 parsecs"));
  EXPECT_THAT(error_of([] { make({{"memory_share", 2}}); }), HasSubstr("memory_share"));
  EXPECT_THAT(error_of([] { make({{"memory_share", -0.5}}); }), HasSubstr("memory_share"));
  EXPECT_THAT(error_of([] { make({{"max_seqs", -1}}); }), HasSubstr("max_seqs"));
  EXPECT_THAT(error_of([] { make({{"memory", 0}}); }), HasSubstr("memory_share"));
  EXPECT_THAT(error_of([] { make({{"bloc_size", 16}}); }), HasSubstr("bloc_size"));
  // A pool smaller than one block names everything that sized it.
  const std::string tiny = error_of([] { make({{"block_size", 32}, {"memory", "16KiB"}}); });
  EXPECT_THAT(tiny, HasSubstr("memory 16384"));
  EXPECT_THAT(tiny, HasSubstr("block_size 32"));
  EXPECT_THAT(tiny, HasSubstr("1280 bytes per token"));
}

TEST(CachePaged, APoolSmallerThanOneFullSequenceIsAllowed) {
  // 4 blocks of 16 = 64 tokens, far below the 512-token context: paging does not need max_context.
  auto c = make({{"block_size", 16}, {"memory", 4 * 16 * kBytesPerToken}});
  EXPECT_EQ(c->stats().blocks_total, 4);
  EXPECT_TRUE(grow(*c, {req(1, 64)}));
  EXPECT_FALSE(c->plan(std::vector<CacheRequest>{req(1, 65)}).has_value());
}

struct GoldenCase {
  std::string prompt;
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> completion;
};

std::vector<GoldenCase> golden_cases() {
  std::vector<GoldenCase> out;
  for (const auto& item : test::read_json(test::kShared + "/golden/stories260K-f32.greedy96.json")) {
    out.push_back({item.at("prompt"), item.at("prompt_token_ids"), item.at("completion_token_ids")});
  }
  return out;
}

// The five golden prompts submitted together; returns the engine's preemption count.
int64_t expect_golden(Pipeline& p) {
  const auto cases = golden_cases();
  EXPECT_EQ(cases.size(), 5u);
  Engine engine(p);
  for (const auto& c : cases) {
    GenerationRequest r;
    r.prompt = c.prompt_ids;
    r.max_tokens = 96;
    engine.submit(std::move(r));
  }
  engine.run_until_idle();
  auto results = engine.take_finished();
  std::sort(results.begin(), results.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  EXPECT_EQ(results.size(), cases.size());
  for (size_t i = 0; i < std::min(results.size(), cases.size()); ++i) {
    EXPECT_EQ(results[i].error, "") << cases[i].prompt;
    EXPECT_EQ(results[i].tokens, cases[i].completion) << cases[i].prompt;
  }
  EXPECT_EQ(p.cache().stats().blocks_used, 0) << "finished sequences must give their blocks back";
  EXPECT_EQ(p.cache().stats().sequences, 0);
  return engine.stats().preemptions;
}

TEST(CachePagedModel, GoldenTokensWithRoomForEveryone) {
  auto p = test::cpu_pipeline(test::kStoriesF32, {{"cache", {{"plugin", "paged"}, {"block_size", 16}}}});
  EXPECT_EQ(expect_golden(*p), 0);
}

TEST(CachePagedModel, GoldenTokensUnderPreemption) {
  // The longest golden sequence holds 19 + 95 = 114 tokens of KV. 16 blocks of 8 (128 tokens,
  // 160KiB) hold any one of them but not all five at once, so sequences are preempted and
  // recomputed; the greedy tokens must not change.
  for (int64_t bs : {8, 16}) {
    SCOPED_TRACE("block_size " + std::to_string(bs));
    auto p = test::cpu_pipeline(test::kStoriesF32,
                                {{"cache", {{"plugin", "paged"}, {"block_size", bs}, {"memory", "160KiB"}}}});
    EXPECT_EQ(p->cache().stats().blocks_total, 128 / bs);
    EXPECT_GT(expect_golden(*p), 0) << "the pool was meant to be too small for all five at once";
  }
}

TEST(CachePagedModel, ASequenceThatOutgrowsThePoolFailsAloneAndCleanly) {
  // 4 blocks of 16 = 64 tokens: the prompt fits, 96 generated tokens do not. The request ends with
  // an error (not a hang, not a crash), the pipeline keeps working, and no block is left behind.
  auto p = test::cpu_pipeline(test::kStoriesF32, {{"cache", {{"plugin", "paged"}, {"block_size", 16},
                                                             {"memory", 4 * 16 * kBytesPerToken}}}});
  const auto cases = golden_cases();
  Engine engine(*p);
  GenerationRequest big;
  big.prompt = cases.at(0).prompt_ids;
  big.max_tokens = 96;
  big.ignore_eos = true;
  engine.submit(std::move(big));
  GenerationRequest small;
  small.prompt = cases.at(0).prompt_ids;
  small.max_tokens = 20;
  engine.submit(std::move(small));
  engine.run_until_idle();
  auto results = engine.take_finished();
  std::sort(results.begin(), results.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0].reason, FinishReason::error);
  EXPECT_NE(results[0].error, "");
  EXPECT_EQ(results[1].error, "");
  const std::vector<int32_t> first20(cases[0].completion.begin(), cases[0].completion.begin() + 20);
  EXPECT_EQ(results[1].tokens, first20);
  EXPECT_EQ(p->cache().stats().blocks_used, 0);
}

}  // namespace
}  // namespace tessera
