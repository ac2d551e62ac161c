// cache: prefix_lru, through the real loader — what prefix reuse adds beyond the cache conformance
// suite: the longest cached prefix is mapped (never the block holding the last token), shared blocks
// are reference counted and never evicted while in use, LRU order, per-user isolation and the shared
// namespace, quotas (max_share, min_share), retain: false, copy-on-write on truncate, stale plans,
// clear parameter errors, and the real model's greedy tokens unchanged by reuse.
#include <gtest/gtest.h>
#include <gmock/gmock.h>

#include <malloc.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "tessera/cache.h"
#include "tessera/engine.h"
#include "tessera/error.h"
#include "tessera/pipeline_spec.h"
#include "tessera/registry.h"

namespace tessera {
namespace {

using nlohmann::json;
using test::cpu_backend;
using testing::HasSubstr;

// stories260K: 5 layers, 4 kv heads, head_dim 8, context 512 -> 1280 bytes per token.
const CacheGeometry kStories{5, 4, 8, 512, DType::F32};
constexpr int64_t kBytesPerToken = 1280;
constexpr int64_t kBs = 4;  // block size of the unit tests: small numbers, easy arithmetic

// Distinct token ids for prompt `id` (ids never repeat across prompts, so nothing is shared by luck).
std::vector<int32_t> prompt(int id, int64_t n) {
  std::vector<int32_t> t;
  for (int64_t i = 0; i < n; ++i) t.push_back(int32_t((id * 1000 + i) % 32000));
  return t;
}
std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// A prefix_lru cache of `blocks` blocks of kBs tokens, driven as the engine drives it.
class Harness {
 public:
  explicit Harness(int64_t blocks, json params = json::object()) {
    if (!params.contains("block_size")) params["block_size"] = kBs;
    if (!params.contains("memory")) params["memory"] = blocks * kBs * kBytesPerToken;
    cache_ = test::plugins().create<Cache>("prefix_lru", params, "test");
    cache_->configure(cpu_backend(), kStories);
  }

  Cache& cache() { return *cache_; }
  CacheStats stats() const { return cache_->stats(); }

  CacheRequest request(SeqId seq, const std::vector<int32_t>& tokens, const std::string& user = "anonymous",
                       bool retain = true) {
    tokens_[seq] = tokens;
    CacheRequest r;
    r.seq = seq;
    r.total_tokens = int64_t(tokens.size());
    r.tokens = tokens_[seq];
    r.user = user;
    r.retain = retain;
    return r;
  }
  // The hit a new sequence would get, without changing anything (-1: it does not fit).
  int64_t peek(const std::vector<int32_t>& tokens, const std::string& user = "anonymous") {
    auto plan = cache_->plan(std::vector<CacheRequest>{request(9999, tokens, user)});
    return plan ? plan->grants.at(0).cached_tokens : -1;
  }
  // Admits a sequence for all its tokens; returns the cached tokens it was granted (-1: no room).
  int64_t admit(SeqId seq, const std::vector<int32_t>& tokens, const std::string& user = "anonymous",
                bool retain = true) {
    auto plan = cache_->plan(std::vector<CacheRequest>{request(seq, tokens, user, retain)});
    if (!plan) return -1;
    cache_->commit(*plan);
    return plan->grants.at(0).cached_tokens;
  }
  void compute(SeqId seq) { cache_->mark_computed(seq, int64_t(tokens_.at(seq).size())); }
  // A whole request: admitted, computed, finished. Returns its hit.
  int64_t run(SeqId seq, const std::vector<int32_t>& tokens, const std::string& user = "anonymous",
              bool retain = true) {
    const int64_t hit = admit(seq, tokens, user, retain);
    EXPECT_GE(hit, 0) << "seq " << seq << " did not fit";
    compute(seq);
    cache_->release(seq);
    return hit;
  }
  std::vector<int32_t> table(SeqId seq) const {
    auto t = cache_->block_table(seq);
    return {t.begin(), t.end()};
  }

 private:
  std::shared_ptr<Cache> cache_;
  std::map<SeqId, std::vector<int32_t>> tokens_;
};

// Counts that must always hold: nothing negative, per-user counts add up to the totals.
void expect_consistent(const CacheStats& s) {
  int64_t cached = 0, evictions = 0, lookups = 0, hits = 0;
  for (const auto& [user, u] : s.users) {
    SCOPED_TRACE("user " + user);
    EXPECT_GE(u.cached_blocks, 0);
    EXPECT_GE(u.evictions, 0);
    EXPECT_LE(u.hit_tokens, u.lookup_tokens);
    cached += u.cached_blocks;
    evictions += u.evictions;
    lookups += u.lookups;
    hits += u.hit_tokens;
  }
  EXPECT_EQ(cached, s.prefix.cached_blocks);
  EXPECT_EQ(evictions, s.prefix.evictions);
  EXPECT_EQ(lookups, s.prefix.lookups);
  EXPECT_EQ(hits, s.prefix.hit_tokens);
  EXPECT_GE(s.prefix.cached_blocks, 0);
  EXPECT_LE(s.prefix.cached_blocks, s.blocks_total);
  EXPECT_GE(s.blocks_used, 0);
  EXPECT_LE(s.blocks_used, s.blocks_total);
}

TEST(CachePrefixLru, MapsTheLongestCachedPrefixButNeverTheLastToken) {
  Harness h(64);
  const auto a = prompt(1, 18);
  EXPECT_EQ(h.run(1, a), 0) << "nothing cached yet";
  EXPECT_EQ(h.stats().prefix.cached_blocks, 4) << "18 tokens: 4 full blocks";
  EXPECT_EQ(h.peek(a), 16) << "the same prompt maps its 4 full blocks";
  // Diverging inside block 2 (token 10): blocks 0 and 1 match.
  auto b = a;
  b[10] = 31999;
  EXPECT_EQ(h.peek(b), 8);
  // Diverging at the very first token: nothing.
  auto c = a;
  c[0] = 31999;
  EXPECT_EQ(h.peek(c), 0);
  // A prompt of exactly 16 cached tokens maps 3 blocks: the last token is recomputed for its logits
  // and must not land in a block another sequence may read.
  EXPECT_EQ(h.peek(std::vector<int32_t>(a.begin(), a.begin() + 16)), 12);
  EXPECT_EQ(h.peek(std::vector<int32_t>(a.begin(), a.begin() + 17)), 16);
  EXPECT_EQ(h.peek(std::vector<int32_t>(a.begin(), a.begin() + 1)), 0);
  // Peeking recorded nothing; committing records the lookup.
  EXPECT_EQ(h.stats().prefix.lookups, 1);
  EXPECT_EQ(h.run(2, concat(a, prompt(2, 5))), 16);
  const CacheStats s = h.stats();
  EXPECT_EQ(s.prefix.lookups, 2);
  EXPECT_EQ(s.prefix.lookup_tokens, 18 + 23);
  EXPECT_EQ(s.prefix.hit_tokens, 16);
  EXPECT_DOUBLE_EQ(s.prefix.hit_rate(), 16.0 / 41.0);
  EXPECT_EQ(s.users.at("anonymous").hit_tokens, 16);
  EXPECT_EQ(s.prefix.cached_blocks, 5) << "23 tokens: its 5th full block joined the 4 it mapped";
  EXPECT_EQ(s.blocks_used, 0);
  expect_consistent(s);
}

TEST(CachePrefixLru, SharedBlocksAreReferenceCounted) {
  Harness h(64);
  const auto a = prompt(1, 13);  // 3 full blocks + 1 token
  ASSERT_EQ(h.admit(1, a), 0);
  h.compute(1);
  // While 1 still runs, 2 maps its full blocks: the same ids, held once.
  ASSERT_EQ(h.admit(2, a), 12);
  const auto t1 = h.table(1), t2 = h.table(2);
  ASSERT_EQ(t1.size(), 4u);
  ASSERT_EQ(t2.size(), 4u);
  EXPECT_TRUE(std::equal(t1.begin(), t1.begin() + 3, t2.begin())) << "the full blocks are shared";
  EXPECT_NE(t1[3], t2[3]) << "the block holding the last token is each sequence's own";
  EXPECT_EQ(h.stats().blocks_used, 5);
  h.compute(2);
  EXPECT_EQ(h.stats().tokens_stored, 12 + 1 + 1) << "shared tokens are held once";
  h.cache().release(1);
  EXPECT_EQ(h.stats().blocks_used, 4) << "2 still holds the shared blocks";
  EXPECT_EQ(h.table(2), t2);
  h.cache().release(2);
  EXPECT_EQ(h.stats().blocks_used, 0);
  EXPECT_EQ(h.stats().prefix.cached_blocks, 3);
  expect_consistent(h.stats());
}

TEST(CachePrefixLru, ABlockInUseIsNeverEvicted) {
  Harness h(8);
  const auto a = prompt(1, 24);  // 6 blocks, all full
  ASSERT_EQ(h.admit(1, a), 0);
  h.compute(1);
  EXPECT_EQ(h.stats().prefix.cached_blocks, 6);
  // 2 free blocks: a request for 3 is refused rather than evicting 1's cached (in-use) blocks.
  EXPECT_EQ(h.admit(2, prompt(2, 12)), -1);
  EXPECT_EQ(h.admit(2, prompt(2, 8)), 0);
  h.cache().release(2);
  h.cache().release(1);
  // Now they are evictable: a request for the whole pool evicts them.
  EXPECT_EQ(h.run(3, prompt(3, 32)), 0);
  EXPECT_EQ(h.peek(a), 0);
  EXPECT_GE(h.stats().prefix.evictions, 6);
  expect_consistent(h.stats());
}

TEST(CachePrefixLru, EvictsInLeastRecentlyUsedOrder) {
  Harness h(12);
  const auto p1 = prompt(1, 9), p2 = prompt(2, 9), p3 = prompt(3, 9);  // 3 blocks each, 2 cached
  h.run(1, p1);
  h.run(2, p2);
  h.run(3, p3);
  EXPECT_EQ(h.run(4, p1), 8) << "p1 is used again: now the most recent";
  EXPECT_EQ(h.stats().prefix.cached_blocks, 6);
  // 8 blocks: the 6 uncached free ones and 2 evicted, the least recently used: p2's.
  h.run(5, prompt(5, 29));
  EXPECT_EQ(h.peek(p2), 0);
  EXPECT_EQ(h.peek(p1), 8);
  EXPECT_EQ(h.peek(p3), 8);
  EXPECT_EQ(h.stats().prefix.evictions, 2);
  // One uncached block is left; taking two evicts one more: p3 is now the oldest, and its tail goes
  // first (a sequence releases its blocks last to first), so its head still hits.
  h.run(6, prompt(6, 1));
  EXPECT_EQ(h.peek(p3), 8) << "an uncached free block was left";
  h.run(7, prompt(7, 5));
  EXPECT_EQ(h.peek(p3), 4);
  EXPECT_EQ(h.peek(p1), 8) << "the most recently used prompt outlives the others";
  expect_consistent(h.stats());
}

TEST(CachePrefixLru, UserIsolationNeverMapsAnotherUsersBlocks) {
  Harness h(64, {{"isolation", "user"}});
  const auto p = prompt(1, 21);
  ASSERT_EQ(h.admit(1, p, "alice"), 0);
  h.compute(1);
  const auto alice_blocks = h.table(1);
  // Bob sends the identical prompt while Alice's blocks are cached and in use, then after.
  EXPECT_EQ(h.admit(2, p, "bob"), 0);
  for (int32_t b : h.table(2)) {
    EXPECT_EQ(std::count(alice_blocks.begin(), alice_blocks.end(), b), 0) << "bob mapped alice's block " << b;
  }
  h.compute(2);
  h.cache().release(1);
  h.cache().release(2);
  EXPECT_EQ(h.peek(p, "alice"), 20);
  EXPECT_EQ(h.peek(p, "bob"), 20) << "bob's own blocks";
  EXPECT_EQ(h.peek(p, "carol"), 0);
  EXPECT_EQ(h.peek(p, "anonymous"), 0);
  const CacheStats s = h.stats();
  EXPECT_EQ(s.users.at("alice").cached_blocks, 5);
  EXPECT_EQ(s.users.at("bob").cached_blocks, 5);
  EXPECT_EQ(s.users.at("bob").hit_tokens, 0);
  expect_consistent(s);
}

TEST(CachePrefixLru, IsolationNoneSharesAcrossUsers) {
  Harness h(64, {{"isolation", "none"}});
  const auto p = prompt(1, 21);
  h.run(1, p, "alice");
  EXPECT_EQ(h.peek(p, "bob"), 20);
  EXPECT_EQ(h.run(2, p, "bob"), 20);
  const CacheStats s = h.stats();
  EXPECT_EQ(s.users.at("alice").cached_blocks, 5) << "blocks belong to the user who created them";
  EXPECT_EQ(s.users.at("bob").hit_tokens, 20);
}

TEST(CachePrefixLru, SharedNamespaceIsVisibleToAllUnderUserPlusShared) {
  const auto system = prompt(1, 16);  // 4 blocks of system prompt
  const auto alice = concat(system, prompt(2, 9)), bob = concat(system, prompt(3, 9));
  Harness h(64, {{"isolation", "user+shared"}, {"shared_users", {"system"}}});
  // The deployment warms the shared namespace with its system prompt (one token more, so that all
  // four blocks are full and cached).
  EXPECT_EQ(h.run(1, concat(system, {7}), "system"), 0);
  EXPECT_EQ(h.stats().users.at("system").cached_blocks, 4);
  EXPECT_EQ(h.run(2, alice, "alice"), 16) << "alice maps the shared system prompt";
  EXPECT_EQ(h.run(3, bob, "bob"), 16) << "so does bob";
  // Alice's own continuation is hers alone.
  EXPECT_EQ(h.peek(alice, "alice"), 24);
  EXPECT_EQ(h.peek(alice, "bob"), 16);
  EXPECT_EQ(h.peek(bob, "alice"), 16);
  // The shared user sees only the shared namespace.
  EXPECT_EQ(h.peek(alice, "system"), 16);
  // Under plain user isolation, the same warm-up shares nothing.
  Harness iso(64, {{"isolation", "user"}, {"shared_users", {"system"}}});
  iso.run(1, concat(system, {7}), "system");
  EXPECT_EQ(iso.peek(alice, "alice"), 0);
  EXPECT_EQ(iso.peek(system, "system"), 12);
  expect_consistent(h.stats());
}

TEST(CachePrefixLru, QuotasKeepALightUsersFloorAgainstAHeavyUser) {
  // 40 blocks; floor 10 blocks per user, cap 30: the heavy user alone could fill the pool to its cap
  // and leave the light one 10 blocks.
  Harness h(40, {{"isolation", "user"}, {"min_share", 0.25}, {"max_share", 0.75}});
  const auto light = prompt(1, 49);  // 12 full blocks
  h.run(1, light, "light");
  EXPECT_EQ(h.stats().users.at("light").cached_blocks, 12);
  for (int i = 0; i < 30; ++i) {
    h.run(SeqId(100 + i), prompt(100 + i, 33), "heavy");  // 9 blocks, 8 cached, each prompt new
    const CacheStats s = h.stats();
    EXPECT_LE(s.users.at("heavy").cached_blocks, 30) << "heavy above max_share after prompt " << i;
    EXPECT_GE(s.users.at("light").cached_blocks, 10) << "light pushed under its floor after prompt " << i;
    expect_consistent(s);
  }
  const CacheStats s = h.stats();
  EXPECT_EQ(s.users.at("light").cached_blocks, 10);
  EXPECT_GT(s.users.at("heavy").evictions, 0);
  // Eviction trimmed the light user's chain from its tail: its first 10 blocks still hit.
  EXPECT_EQ(h.peek(light, "light"), 40);
  EXPECT_EQ(s.blocks_used, 0);

  // Without quotas the same traffic evicts the light user completely.
  Harness open(40, {{"isolation", "user"}});
  open.run(1, light, "light");
  for (int i = 0; i < 30; ++i) open.run(SeqId(100 + i), prompt(100 + i, 33), "heavy");
  EXPECT_EQ(open.stats().users.at("light").cached_blocks, 0);
  EXPECT_EQ(open.peek(light, "light"), 0);
  expect_consistent(open.stats());
}

TEST(CachePrefixLru, MaxShareCapsOneUsersCachedBlocks) {
  Harness h(40, {{"max_share", 0.25}});
  const auto p = prompt(1, 81);  // 20 full blocks in one sequence
  ASSERT_EQ(h.admit(1, p), 0);
  h.compute(1);
  EXPECT_EQ(h.stats().prefix.cached_blocks, 10) << "the first 10 blocks are cached, the rest are not";
  h.cache().release(1);
  EXPECT_EQ(h.stats().blocks_used, 0);
  EXPECT_EQ(h.peek(p), 40);
  // Later prompts replace the user's own least recently used blocks.
  h.run(2, prompt(2, 21));
  EXPECT_EQ(h.stats().prefix.cached_blocks, 10);
  EXPECT_EQ(h.peek(prompt(2, 21)), 20);
  EXPECT_LT(h.peek(p), 40);
  expect_consistent(h.stats());
}

// #51: every new `user` used to add state and a namespace that lived forever (20,000 users: RSS
// 61 -> 349 MB). A user's state now lives while it runs or holds cached blocks, then among the 1,000
// most recently active idle users; the report names at most 100 users, the rest summed as "_other".
TEST(CachePrefixLru, DistinctUsersLeaveMemoryAndTheReportBounded) {
  Harness h(64);
  auto one_user = [&](int i) { h.run(1, prompt(i % 50, 2 * kBs + 1), "user-" + std::to_string(i)); };
  for (int i = 0; i < 2000; ++i) one_user(i);
  const size_t heap_before = mallinfo2().uordblks;
  for (int i = 2000; i < 102000; ++i) one_user(i);
  const size_t heap_after = mallinfo2().uordblks;
  EXPECT_LT(heap_after, heap_before + (size_t(1) << 20))
      << "100,000 more distinct users grew the heap from " << heap_before << " to " << heap_after << " bytes";
  const CacheStats s = h.stats();
  EXPECT_LE(s.users.size(), 101u);
  ASSERT_TRUE(s.users.count("_other"));
  EXPECT_EQ(s.prefix.lookups, 102000);
  expect_consistent(s);  // forgotten users' counters are in "_other"
  // A user that comes back after being forgotten starts again, and isolation still holds: the
  // prompt cached by user-5's namesakes is not visible to a new user.
  EXPECT_EQ(h.peek(prompt(5, 2 * kBs + 1), "someone-new"), 0);
  EXPECT_EQ(h.stats().blocks_used, 0);
}

TEST(CachePrefixLru, RetainFalseLeavesNothingCached) {
  const auto p = prompt(1, 21);
  {
    Harness h(64, {{"isolation", "none"}});
    EXPECT_EQ(h.run(1, p, "anonymous", /*retain=*/false), 0);
    EXPECT_EQ(h.stats().prefix.cached_blocks, 0);
    EXPECT_EQ(h.peek(p), 0);
    // A non-retained request may still map what others cached; it adds nothing.
    h.run(2, p);
    EXPECT_EQ(h.run(3, concat(p, prompt(2, 12)), "anonymous", false), 20);
    EXPECT_EQ(h.stats().prefix.cached_blocks, 5);
    EXPECT_EQ(h.stats().blocks_used, 0);
  }
  {
    Harness h(64, {{"private_users", {"ghost"}}});
    h.run(1, p, "ghost");
    EXPECT_EQ(h.stats().prefix.cached_blocks, 0);
    EXPECT_EQ(h.stats().users.at("ghost").cached_blocks, 0);
    h.run(2, p, "alice");
    EXPECT_EQ(h.stats().prefix.cached_blocks, 5);
  }
  {
    Harness h(64, {{"retain", false}});
    h.run(1, p);
    h.run(2, p);
    EXPECT_EQ(h.stats().prefix.cached_blocks, 0);
    EXPECT_EQ(h.stats().prefix.hit_tokens, 0);
  }
}

TEST(CachePrefixLru, TruncateCopiesASharedBlockAndUncachesAnOwnOne) {
  Harness h(64);
  const auto p = prompt(1, 21);
  ASSERT_EQ(h.admit(1, p), 0);
  h.compute(1);
  // Fill 1's blocks with recognisable KV.
  Backend& b = cpu_backend();
  const KvLayerView v = h.cache().layer(2);
  const size_t pool_floats = size_t(v.num_blocks * v.block_stride());
  const auto k_data = test::random_floats(pool_floats, 11);
  b.copy_to_device(v.k, k_data.data(), pool_floats * sizeof(float));
  ASSERT_EQ(h.admit(2, p), 20);
  const auto t1 = h.table(1), t2 = h.table(2);
  ASSERT_EQ(t2[2], t1[2]);
  // 2 rolls back into block 2 (tokens 8..11), which 1 and the cache share: 2 gets a copy.
  h.cache().truncate(2, 10);
  const auto t2b = h.table(2);
  ASSERT_EQ(t2b.size(), 3u);
  EXPECT_EQ(t2b[0], t1[0]);
  EXPECT_EQ(t2b[1], t1[1]);
  EXPECT_NE(t2b[2], t1[2]) << "a shared block must be copied before it is written";
  std::vector<float> copied(size_t(v.block_stride())), original(size_t(v.block_stride()));
  b.copy_to_host(copied.data(), static_cast<float*>(v.k) + t2b[2] * v.block_stride(), copied.size() * sizeof(float));
  b.copy_to_host(original.data(), static_cast<float*>(v.k) + t1[2] * v.block_stride(), original.size() * sizeof(float));
  EXPECT_EQ(copied, original) << "the copy holds the shared block's KV";
  EXPECT_EQ(h.peek(p), 20) << "the cached chain is intact";
  h.cache().release(2);
  // 1 alone holds its block 2 now: truncating into it takes it out of the cache instead.
  h.cache().truncate(1, 10);
  EXPECT_EQ(h.table(1).size(), 3u);
  EXPECT_EQ(h.table(1)[2], t1[2]);
  EXPECT_EQ(h.peek(p), 8) << "block 2 will be rewritten, so it no longer serves the old tokens";
  h.cache().release(1);
  EXPECT_EQ(h.stats().blocks_used, 0);
  expect_consistent(h.stats());
}

TEST(CachePrefixLru, CommitOfAStalePlanThrowsAndChangesNothing) {
  Harness h(8);
  const auto p = prompt(1, 13);
  h.run(1, p);
  auto hit = h.cache().plan(std::vector<CacheRequest>{h.request(2, p)});
  ASSERT_TRUE(hit.has_value());
  ASSERT_EQ(hit->grants[0].cached_tokens, 12);
  // Another sequence takes the whole pool, evicting the blocks the plan counted on.
  h.run(3, prompt(3, 32));
  const CacheStats before = h.stats();
  try {
    h.cache().commit(*hit);
    ADD_FAILURE() << "a stale plan was committed";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("stale"));
  }
  EXPECT_TRUE(h.table(2).empty());
  EXPECT_EQ(h.stats().blocks_used, before.blocks_used);
}

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

TEST(CachePrefixLru, BadParametersAreNamed) {
  auto make = [](json p) { Harness h(8, std::move(p)); };
  EXPECT_THAT(error_of([&] { make({{"isolation", "everyone"}}); }), HasSubstr("isolation"));
  EXPECT_THAT(error_of([&] { make({{"max_share", 1.5}}); }), HasSubstr("max_share"));
  EXPECT_THAT(error_of([&] { make({{"min_share", -0.1}}); }), HasSubstr("min_share"));
  EXPECT_THAT(error_of([&] { make({{"min_share", 0.6}, {"max_share", 0.5}}); }), HasSubstr("min_share"));
  EXPECT_THAT(error_of([&] { make({{"shared_users", json::array({1})}}); }), HasSubstr("shared_users"));
  const std::string both = error_of([&] { make({{"shared_users", {"sys"}}, {"private_users", {"sys"}}}); });
  EXPECT_THAT(both, HasSubstr("'sys'"));
  EXPECT_THAT(both, HasSubstr("private_users"));
  EXPECT_THAT(error_of([&] { make({{"block_size", 0}}); }), HasSubstr("block_size"));
}

// ---- the real model ----

struct Case {
  std::vector<int32_t> prompt;
  std::string user = "anonymous";
};

// Prompts that share a long prefix: a 115-token story (a golden prompt and its greedy completion),
// followed by each golden prompt (without its BOS) as a different question.
std::vector<std::vector<int32_t>> shared_prefix_prompts() {
  const auto golden = test::read_json(test::kShared + "/golden/stories260K-f32.greedy96.json");
  std::vector<int32_t> prefix = golden.at(3).at("prompt_token_ids");
  const std::vector<int32_t> story = golden.at(3).at("completion_token_ids");
  prefix.insert(prefix.end(), story.begin(), story.end());
  std::vector<std::vector<int32_t>> out;
  for (const auto& item : golden) {
    const std::vector<int32_t> q = item.at("prompt_token_ids");
    out.push_back(concat(prefix, std::vector<int32_t>(q.begin() + 1, q.end())));
  }
  return out;
}

struct Outcome {
  std::vector<GenerationResult> results;  // in submission order
  EngineStats engine;
  CacheStats cache;
};

// Submits the waves one after another (each runs to completion before the next is submitted), so
// later waves can reuse what earlier ones cached.
Outcome run_waves(Pipeline& p, const std::vector<std::vector<Case>>& waves, int64_t max_tokens = 40) {
  Engine engine(p);
  Outcome out;
  for (const auto& wave : waves) {
    for (const Case& c : wave) {
      GenerationRequest r;
      r.prompt = c.prompt;
      r.max_tokens = max_tokens;
      r.user = c.user;
      engine.submit(std::move(r));
    }
    engine.run_until_idle();
    auto done = engine.take_finished();
    std::sort(done.begin(), done.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
    out.results.insert(out.results.end(), done.begin(), done.end());
  }
  out.engine = engine.stats();
  out.cache = p.cache().stats();
  return out;
}

std::vector<std::vector<Case>> exactness_waves() {
  const auto prompts = shared_prefix_prompts();
  std::vector<Case> all;
  for (const auto& p : prompts) all.push_back({p});
  // One alone (it caches the prefix), then all together (they map it), then all again (whole prompts).
  return {{all[0]}, all, all};
}

void expect_same_tokens(const Outcome& got, const Outcome& want) {
  ASSERT_EQ(got.results.size(), want.results.size());
  for (size_t i = 0; i < want.results.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    EXPECT_EQ(got.results[i].error, "");
    EXPECT_EQ(got.results[i].tokens, want.results[i].tokens);
  }
}

TEST(CachePrefixLruModel, OutputsWithReuseEqualOutputsWithoutTokenForToken) {
  const auto waves = exactness_waves();
  auto paged = test::cpu_pipeline(test::kStoriesF32, {{"cache", {{"plugin", "paged"}, {"block_size", 16}}}});
  const Outcome want = run_waves(*paged, waves);
  auto prefix = test::cpu_pipeline(test::kStoriesF32, {{"cache", {{"plugin", "prefix_lru"}, {"block_size", 16}}}});
  const Outcome got = run_waves(*prefix, waves);
  expect_same_tokens(got, want);
  // The first request found nothing; every later one mapped at least the 115-token prefix's 7 blocks.
  EXPECT_EQ(got.results[0].cached_tokens, 0);
  for (size_t i = 1; i < got.results.size(); ++i) {
    EXPECT_GE(got.results[i].cached_tokens, 112) << "request " << i;
    EXPECT_LT(got.results[i].cached_tokens, int64_t(got.results[i].prompt.size()));
    EXPECT_EQ(want.results[i].cached_tokens, 0) << "paged reuses nothing";
  }
  int64_t hit = 0;
  for (const auto& r : got.results) hit += r.cached_tokens;
  EXPECT_EQ(got.cache.prefix.hit_tokens, hit);
  EXPECT_EQ(got.engine.prefill_tokens, want.engine.prefill_tokens - hit) << "every hit token is a prefill token saved";
  EXPECT_GT(got.cache.prefix.hit_rate(), 0.8);
  EXPECT_EQ(got.cache.blocks_used, 0) << "finished sequences must give their blocks back";
  EXPECT_EQ(got.cache.sequences, 0);
  EXPECT_GT(got.cache.prefix.cached_blocks, 0);
  expect_consistent(got.cache);
}

TEST(CachePrefixLruModel, ExactUnderChunkedPrefillPreemptionAndEviction) {
  // Small prefill chunks (a hit moves a sequence past what the scheduler reserved) and a pool too
  // small for everyone (preemption, then eviction of cached blocks).
  const auto waves = exactness_waves();
  auto paged = test::cpu_pipeline(test::kStoriesF32, {{"cache", {{"plugin", "paged"}, {"block_size", 16}}}});
  const Outcome want = run_waves(*paged, waves);
  const json scheduler = {{"plugin", "continuous"}, {"max_batch_tokens", 24}, {"max_seqs", 8}};
  for (int64_t bs : {8, 16}) {
    SCOPED_TRACE("block_size " + std::to_string(bs));
    // 36 blocks of 8 or 18 of 16 = 288 tokens: two sequences of ~175 tokens do not fit together.
    auto prefix = test::cpu_pipeline(
        test::kStoriesF32, {{"cache", {{"plugin", "prefix_lru"}, {"block_size", bs}, {"memory", 288 * kBytesPerToken}}},
                            {"scheduler", scheduler}});
    const Outcome got = run_waves(*prefix, waves);
    expect_same_tokens(got, want);
    EXPECT_GT(got.engine.preemptions, 0) << "the pool was meant to be too small for all at once";
    EXPECT_GT(got.cache.prefix.hit_tokens, 0);
    for (const auto& r : got.results) {
      // Found at admission, where the last prompt token is always computed; a recomputation after
      // preemption finding the sequence's own blocks again is no prompt token cached.
      EXPECT_LT(r.cached_tokens, int64_t(r.prompt.size())) << "request " << r.id << ", " << r.preemptions << " preemptions";
    }
    EXPECT_EQ(got.cache.blocks_used, 0);
    expect_consistent(got.cache);
  }
}

TEST(CachePrefixLruModel, UsersDoNotShareUnlessTheNamespaceIsShared) {
  const auto prompts = shared_prefix_prompts();
  {
    auto p = test::cpu_pipeline(test::kStoriesF32, {{"cache", {{"plugin", "prefix_lru"}, {"isolation", "user"}}}});
    const Outcome o = run_waves(*p, {{{prompts[0], "alice"}}, {{prompts[0], "bob"}}, {{prompts[0], "alice"}}}, 8);
    EXPECT_EQ(o.results[1].cached_tokens, 0) << "bob never maps alice's blocks";
    EXPECT_GT(o.results[2].cached_tokens, 0) << "alice maps her own";
    EXPECT_EQ(o.results[1].tokens, o.results[0].tokens);
    EXPECT_EQ(o.results[2].tokens, o.results[0].tokens);
  }
  {
    auto p = test::cpu_pipeline(test::kStoriesF32, {{"cache", {{"plugin", "prefix_lru"}, {"isolation", "user+shared"},
                                                              {"shared_users", {"system"}}}}});
    // The operator's warm-up request writes the shared prefix; then both users map it.
    const std::vector<int32_t> system(prompts[0].begin(), prompts[0].begin() + 115);
    const Outcome o = run_waves(*p, {{{system, "system"}}, {{prompts[1], "alice"}, {prompts[2], "bob"}}}, 8);
    EXPECT_EQ(o.results[1].cached_tokens, 112);
    EXPECT_EQ(o.results[2].cached_tokens, 112);
    EXPECT_EQ(o.cache.users.at("alice").hit_tokens, 112);
    EXPECT_EQ(o.cache.users.at("bob").hit_tokens, 112);
    EXPECT_EQ(o.cache.users.at("system").cached_blocks, 7);
  }
}

TEST(CachePrefixLruModel, ShippedPipelineSharesTheSystemPromptWrittenByTheSystemUser) {
  // pipelines/prefix.yaml declares shared_users: [system] under isolation user+shared.
  PipelineSpec spec = load_pipeline_spec(TESSERA_SOURCE_DIR "/pipelines/prefix.yaml");
  spec.model = test::kStoriesF32;
  spec.backend = "cpu";
  EXPECT_EQ(spec.components.at(ComponentKind::cache).plugin, "prefix_lru");
  auto p = Pipeline::build(spec, test::plugins());
  const auto prompts = shared_prefix_prompts();
  const std::vector<int32_t> system(prompts[0].begin(), prompts[0].begin() + 115);
  // prompts[3] is 133 tokens: 8 full blocks may be mapped, the 8th holding the question's start.
  const Outcome o = run_waves(
      *p, {{{system, "system"}}, {{prompts[3], "alice"}}, {{prompts[3], "bob"}}, {{prompts[3], "alice"}}}, 8);
  EXPECT_EQ(o.results[1].cached_tokens, 112) << "alice maps the system prompt";
  EXPECT_EQ(o.results[2].cached_tokens, 112) << "bob maps the system prompt, but not alice's question";
  EXPECT_EQ(o.results[3].cached_tokens, 128) << "alice maps the system prompt and her own question";
  EXPECT_EQ(o.results[2].tokens, o.results[1].tokens);
  EXPECT_EQ(o.results[3].tokens, o.results[1].tokens);
}

}  // namespace
}  // namespace tessera
