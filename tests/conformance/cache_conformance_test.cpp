// Cache conformance: every cache plugin the loader finds, with its defaults, configured on the CPU
// backend with stories260K's geometry (5 layers, 4 kv heads, head_dim 8, context 512). Checks the
// transactional contract the engine relies on: plan() is a pure question, commit() gives each
// sequence distinct in-range blocks covering its tokens, growth keeps the existing table, a request
// that cannot fit is refused without side effects, release() returns blocks, truncate() gives back
// the blocks past the kept tokens, and one sequence's KV never overwrites another's. Token ids are random per sequence so that a prefix cache finds
// nothing to share and block accounting is exact.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "conformance/conformance_util.h"
#include "tessera/cache.h"
#include "tessera/error.h"

namespace tessera {
namespace {

using namespace conformance;

const CacheGeometry kGeometry{5, 4, 8, 512, DType::F32};

class CacheConformance : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    cache_ = create_default<Cache>(GetParam());
    cache_->configure(cpu(), kGeometry);
    start_ = cache_->stats();
    block_size_ = cache_->layer(0).block_size;
  }

  // A request with its own random tokens (seeded by the sequence id, so regrowing keeps the prefix).
  CacheRequest request(SeqId seq, int64_t total, bool retain = true) {
    auto& toks = tokens_[seq];
    const auto all = random_ints(size_t(kGeometry.max_context), 5000 + seq, 0, 511);
    toks.assign(all.begin(), all.begin() + std::min<int64_t>(total, kGeometry.max_context));
    CacheRequest r;
    r.seq = seq;
    r.total_tokens = total;
    r.tokens = toks;
    r.retain = retain;
    return r;
  }

  // plan + commit, failing the test if it does not fit.
  void grow(const std::vector<CacheRequest>& reqs) {
    auto plan = cache_->plan(reqs);
    ASSERT_TRUE(plan.has_value()) << "a request that fits was refused";
    cache_->commit(*plan);
  }

  int64_t blocks_for(int64_t tokens) const { return (tokens + block_size_ - 1) / block_size_; }

  // How many sequences of max_context tokens the pool can hold (sequences that share nothing).
  int64_t full_length_capacity() const { return start_.blocks_total / blocks_for(kGeometry.max_context); }

  std::vector<int32_t> table(SeqId seq) const {
    auto t = cache_->block_table(seq);
    return {t.begin(), t.end()};
  }

  static void expect_same_stats(const CacheStats& a, const CacheStats& b) {
    EXPECT_EQ(a.blocks_used, b.blocks_used);
    EXPECT_EQ(a.blocks_total, b.blocks_total);
    EXPECT_EQ(a.sequences, b.sequences);
    EXPECT_EQ(a.bytes_used, b.bytes_used);
    EXPECT_EQ(a.tokens_stored, b.tokens_stored);
    EXPECT_EQ(a.slots_allocated, b.slots_allocated);
  }

  std::shared_ptr<Cache> cache_;
  CacheStats start_;
  int64_t block_size_ = 0;
  std::map<SeqId, std::vector<int32_t>> tokens_;
};

TEST(CachePlugins, AtLeastOneIsLoaded) {
  EXPECT_FALSE(plugin_names(ComponentKind::cache).empty())
      << "no cache plugin in " << plugin_source() << "\n" << load_failures();
}

TEST_P(CacheConformance, LayersDescribeTheGeometry) {
  EXPECT_GT(block_size_, 0);
  EXPECT_GT(start_.blocks_total, 0);
  EXPECT_EQ(start_.blocks_used, 0);
  EXPECT_EQ(start_.sequences, 0);
  EXPECT_EQ(start_.block_size, block_size_);
  EXPECT_GE(full_length_capacity(), 1) << "configure() must refuse a pool that cannot hold one full sequence";
  std::set<const void*> pools;
  for (int64_t l = 0; l < kGeometry.n_layers; ++l) {
    const KvLayerView v = cache_->layer(l);
    EXPECT_EQ(v.dtype, kGeometry.dtype);
    EXPECT_EQ(v.n_kv_heads, kGeometry.n_kv_heads);
    EXPECT_EQ(v.head_dim, kGeometry.head_dim);
    EXPECT_EQ(v.block_size, block_size_);
    EXPECT_GE(v.num_blocks, start_.blocks_total);
    ASSERT_NE(v.k, nullptr);
    ASSERT_NE(v.v, nullptr);
    pools.insert(v.k);
    pools.insert(v.v);
  }
  EXPECT_EQ(pools.size(), size_t(2 * kGeometry.n_layers)) << "layers or K/V share a pool";
}

TEST_P(CacheConformance, PlanIsSideEffectFreeAndRepeatable) {
  grow({request(1, 40)});
  const CacheStats before = cache_->stats();
  const auto table1 = table(1);
  const std::vector<CacheRequest> reqs = {request(1, 90), request(2, 33), request(3, 1)};
  auto a = cache_->plan(reqs);
  auto b = cache_->plan(reqs);
  ASSERT_TRUE(a.has_value());
  ASSERT_TRUE(b.has_value());
  ASSERT_EQ(a->grants.size(), reqs.size());
  ASSERT_EQ(b->grants.size(), reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(a->grants[i].seq, reqs[i].seq);
    EXPECT_EQ(a->grants[i].seq, b->grants[i].seq);
    EXPECT_EQ(a->grants[i].new_blocks, b->grants[i].new_blocks);
    EXPECT_EQ(a->grants[i].cached_tokens, b->grants[i].cached_tokens);
    EXPECT_EQ(a->grants[i].cached_tokens, 0) << "no tokens were shared, so nothing can be cached";
  }
  expect_same_stats(cache_->stats(), before);
  EXPECT_EQ(table(1), table1);
  EXPECT_TRUE(table(2).empty());
  EXPECT_TRUE(table(3).empty());
}

TEST_P(CacheConformance, CommitGivesDistinctInRangeBlocksCoveringTheTokens) {
  const std::vector<int64_t> lens = {1, 17, 300, 512, 64};
  std::vector<CacheRequest> reqs;
  for (size_t i = 0; i < lens.size(); ++i) reqs.push_back(request(SeqId(10 + i), lens[i]));
  // Fewer sequences if the pool is small: the point is coverage and distinctness, not capacity.
  while (int64_t(reqs.size()) > full_length_capacity() && reqs.size() > 1) reqs.pop_back();
  auto plan = cache_->plan(reqs);
  ASSERT_TRUE(plan.has_value());
  int64_t promised = 0;
  for (const CacheGrant& g : plan->grants) promised += g.new_blocks;
  cache_->commit(*plan);
  const CacheStats after = cache_->stats();
  EXPECT_EQ(after.blocks_used - start_.blocks_used, promised) << "commit took other than the planned blocks";
  EXPECT_EQ(after.sequences, int64_t(reqs.size()));
  std::set<int32_t> seen;
  int64_t listed = 0;
  const int64_t num_blocks = cache_->layer(0).num_blocks;
  for (const CacheRequest& r : reqs) {
    SCOPED_TRACE("seq " + std::to_string(r.seq));
    const auto t = table(r.seq);
    EXPECT_GE(int64_t(t.size()) * block_size_, r.total_tokens);
    for (int32_t id : t) {
      EXPECT_GE(id, 0);
      EXPECT_LT(id, num_blocks);
      EXPECT_TRUE(seen.insert(id).second) << "block " << id << " handed out twice";
      ++listed;
    }
  }
  EXPECT_LE(after.blocks_used, listed + start_.blocks_used);
}

TEST_P(CacheConformance, GrowingKeepsTheExistingTablePrefix) {
  grow({request(1, 5), request(2, 5)});
  const auto t2 = table(2);
  for (int64_t total : {int64_t(6), std::min<int64_t>(block_size_ + 1, 511), int64_t(200), int64_t(512)}) {
    const auto prev = table(1);
    grow({request(1, total)});
    const auto now = table(1);
    ASSERT_GE(now.size(), prev.size());
    EXPECT_TRUE(std::equal(prev.begin(), prev.end(), now.begin())) << "growing to " << total << " moved blocks";
    EXPECT_GE(int64_t(now.size()) * block_size_, total);
  }
  EXPECT_EQ(table(2), t2) << "growing one sequence changed another's table";
  // Asking again for what a sequence already holds takes nothing new.
  const CacheStats before = cache_->stats();
  auto again = cache_->plan(std::vector<CacheRequest>{request(1, 512)});
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->grants[0].new_blocks, 0);
  cache_->commit(*again);
  EXPECT_EQ(cache_->stats().blocks_used, before.blocks_used);
}

TEST_P(CacheConformance, RefusesWhatDoesNotFitWithoutSideEffects) {
  grow({request(1, 10)});
  const CacheStats before = cache_->stats();
  const auto t1 = table(1);
  // Longer than the model's context.
  EXPECT_FALSE(cache_->plan(std::vector<CacheRequest>{request(2, kGeometry.max_context + 1)}).has_value());
  EXPECT_FALSE(cache_->plan(std::vector<CacheRequest>{request(1, kGeometry.max_context + 1)}).has_value());
  // More full-length sequences than the pool holds (with sequence 1 already in it).
  std::vector<CacheRequest> many;
  const int64_t n = full_length_capacity() + 1;
  for (int64_t i = 0; i < n; ++i) many.push_back(request(SeqId(100 + i), kGeometry.max_context));
  EXPECT_FALSE(cache_->plan(many).has_value()) << n << " sequences of " << kGeometry.max_context << " tokens";
  expect_same_stats(cache_->stats(), before);
  EXPECT_EQ(table(1), t1);
  EXPECT_TRUE(table(2).empty());
  EXPECT_TRUE(table(100).empty());
  // And the cache still works afterwards.
  grow({request(2, 30)});
  EXPECT_FALSE(table(2).empty());
}

// A per-sequence bound (the engine stops a sequence there, as at the model's context) must be one
// the cache keeps: a sequence that long fits an empty cache, one token more does not.
TEST_P(CacheConformance, APerSequenceBoundIsTheOneItKeeps) {
  const int64_t bound = start_.max_seq_tokens;
  ASSERT_GE(bound, 0);
  if (bound == 0) GTEST_SKIP() << "no per-sequence bound but the pool's";
  EXPECT_LE(bound, kGeometry.max_context);
  EXPECT_TRUE(cache_->plan(std::vector<CacheRequest>{request(1, bound)}).has_value());
  EXPECT_FALSE(cache_->plan(std::vector<CacheRequest>{request(1, bound + 1)}).has_value());
}

TEST_P(CacheConformance, FillsToCapacityAndReleaseReturnsBlocks) {
  // retain = false: the user opted out of prefix retention, so a prefix cache must free the blocks
  // outright and blocks_used has a single right answer.
  const int64_t n = std::min<int64_t>(full_length_capacity(), 64);
  std::vector<CacheRequest> reqs;
  for (int64_t i = 0; i < n; ++i) reqs.push_back(request(SeqId(1 + i), kGeometry.max_context, false));
  grow(reqs);
  if (n == full_length_capacity()) {
    EXPECT_FALSE(cache_->plan(std::vector<CacheRequest>{request(999, kGeometry.max_context, false)}).has_value())
        << "the pool is full";
  }
  for (int64_t i = 0; i < n; ++i) {
    cache_->mark_computed(SeqId(1 + i), kGeometry.max_context);
  }
  EXPECT_EQ(cache_->stats().tokens_stored, n * kGeometry.max_context);
  for (int64_t i = 0; i < n; ++i) {
    cache_->release(SeqId(1 + i));
    EXPECT_TRUE(table(SeqId(1 + i)).empty());
  }
  const CacheStats after = cache_->stats();
  EXPECT_EQ(after.blocks_used, start_.blocks_used);
  EXPECT_EQ(after.sequences, 0);
  EXPECT_EQ(after.tokens_stored, 0);
  // The freed blocks serve new sequences.
  std::vector<CacheRequest> again;
  for (int64_t i = 0; i < n; ++i) again.push_back(request(SeqId(500 + i), kGeometry.max_context, false));
  grow(again);
}

TEST_P(CacheConformance, RetainedBlocksStillServeNewSequences) {
  // retain = true: a prefix cache may keep finished blocks for reuse, but they count as free: new
  // sequences with other tokens get the whole pool again (what is kept is evicted as needed).
  const int64_t n = std::min<int64_t>(full_length_capacity(), 64);
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    std::vector<CacheRequest> reqs;
    for (int64_t i = 0; i < n; ++i) reqs.push_back(request(SeqId(1000 * (round + 1) + i), kGeometry.max_context));
    grow(reqs);
    for (const CacheRequest& r : reqs) cache_->mark_computed(r.seq, kGeometry.max_context);
    for (const CacheRequest& r : reqs) cache_->release(r.seq);
    EXPECT_EQ(cache_->stats().sequences, 0);
  }
}

TEST_P(CacheConformance, TruncateFreesBlocksAndShrinksTheTable) {
  // Speculative decoding rolls a sequence back to its accepted tokens: the table keeps the blocks
  // that cover them (in place), the rest go back to the pool, and the sequence grows again from there.
  for (const bool retain : {false, true}) {
    SCOPED_TRACE(retain ? "retain" : "no retain");
    const SeqId seq = retain ? 2 : 1;
    grow({request(seq, 300, retain)});
    cache_->mark_computed(seq, 300);
    const auto full = table(seq);
    for (int64_t keep : {int64_t(300), int64_t(200), int64_t(150), int64_t(37), int64_t(1)}) {
      SCOPED_TRACE("truncate to " + std::to_string(keep));
      cache_->truncate(seq, keep);
      const auto now = table(seq);
      EXPECT_EQ(int64_t(now.size()), blocks_for(keep));
      EXPECT_TRUE(std::equal(now.begin(), now.end(), full.begin())) << "truncation moved a kept block";
      const CacheStats s = cache_->stats();
      EXPECT_EQ(s.blocks_used, start_.blocks_used + blocks_for(keep)) << "blocks past the kept tokens were not freed";
      EXPECT_EQ(s.tokens_stored, keep);
      EXPECT_EQ(s.sequences, 1);
    }
    // Truncating past what is held, or an unknown sequence, changes nothing.
    cache_->truncate(seq, 400);
    cache_->truncate(999, 5);
    EXPECT_EQ(int64_t(table(seq).size()), blocks_for(1));
    EXPECT_EQ(cache_->stats().tokens_stored, 1);
    // It grows again from the kept prefix.
    const auto kept = table(seq);
    grow({request(seq, 100, retain)});
    const auto regrown = table(seq);
    EXPECT_EQ(int64_t(regrown.size()), blocks_for(100));
    EXPECT_TRUE(std::equal(kept.begin(), kept.end(), regrown.begin()));
    EXPECT_EQ(std::set<int32_t>(regrown.begin(), regrown.end()).size(), regrown.size());
    cache_->mark_computed(seq, 100);
    EXPECT_EQ(cache_->stats().tokens_stored, 100);
    cache_->release(seq);
    EXPECT_EQ(cache_->stats().blocks_used, start_.blocks_used);
    EXPECT_EQ(cache_->stats().sequences, 0);
  }
}

TEST_P(CacheConformance, SequencesDoNotOverwriteEachOther) {
  Backend& b = cpu();
  const int64_t row = kGeometry.n_kv_heads * kGeometry.head_dim;
  const std::vector<std::pair<SeqId, int64_t>> seqs = {{1, 37}, {2, 21}, {3, 1}};
  std::vector<CacheRequest> reqs;
  for (const auto& [id, n] : seqs) reqs.push_back(request(id, n));
  while (int64_t(reqs.size()) > full_length_capacity() && reqs.size() > 1) reqs.pop_back();
  grow(reqs);

  // Each (layer, sequence) gets its own data, written sequence by sequence through kv_write.
  auto data = [&](int64_t layer, SeqId seq, int64_t n, int kv) {
    return random_floats(size_t(n * row), 7000 + uint64_t(layer) * 100 + seq * 10 + uint64_t(kv));
  };
  auto slots_of = [&](SeqId seq, int64_t n) {
    const auto t = table(seq);
    std::vector<int32_t> s;
    for (int64_t p = 0; p < n; ++p) s.push_back(int32_t(t[size_t(p / block_size_)] * block_size_ + p % block_size_));
    return s;
  };
  for (int64_t l = 0; l < kGeometry.n_layers; ++l) {
    for (const CacheRequest& r : reqs) {
      const auto k = data(l, r.seq, r.total_tokens, 0), v = data(l, r.seq, r.total_tokens, 1);
      const auto s = slots_of(r.seq, r.total_tokens);
      DeviceBuffer kb = upload(b, k), vb = upload(b, v), sb = upload(b, s);
      b.kv_write(cache_->layer(l), kb.as<float>(), vb.as<float>(), sb.as<int32_t>(), r.total_tokens);
    }
  }
  b.synchronize();
  for (int64_t l = 0; l < kGeometry.n_layers; ++l) {
    const KvLayerView view = cache_->layer(l);
    const size_t pool = size_t(view.num_blocks * view.block_stride());
    const auto kc = download<float>(b, view.k, pool), vc = download<float>(b, view.v, pool);
    for (const CacheRequest& r : reqs) {
      SCOPED_TRACE("layer " + std::to_string(l) + " seq " + std::to_string(r.seq));
      const auto k = data(l, r.seq, r.total_tokens, 0), v = data(l, r.seq, r.total_tokens, 1);
      const auto s = slots_of(r.seq, r.total_tokens);
      size_t wrong = 0;
      for (int64_t p = 0; p < r.total_tokens; ++p) {
        for (int64_t e = 0; e < row; ++e) {
          wrong += kc[size_t(s[size_t(p)] * row + e)] != k[size_t(p * row + e)];
          wrong += vc[size_t(s[size_t(p)] * row + e)] != v[size_t(p * row + e)];
        }
      }
      EXPECT_EQ(wrong, 0u) << "another sequence or layer overwrote this one's KV";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Caches, CacheConformance, testing::ValuesIn(plugin_names(ComponentKind::cache)),
                         param_name);

}  // namespace
}  // namespace tessera
