// BlockPool alone: all-or-nothing allocation, reference counts, reuse order, and errors that name
// the block and the pool, plus a seeded random walk checked against a plain model of the state.
#include <gtest/gtest.h>
#include <gmock/gmock.h>

#include <algorithm>
#include <deque>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "tessera/block_pool.h"
#include "tessera/error.h"

namespace tessera {
namespace {

using testing::HasSubstr;

// Runs `f`, expecting a tessera::Error whose message contains every one of `parts`.
template <class F>
void expect_error(F f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    for (const auto& p : parts) EXPECT_THAT(e.what(), HasSubstr(p));
  }
}

TEST(BlockPool, StartsAllFree) {
  BlockPool pool(10);
  EXPECT_EQ(pool.num_blocks(), 10);
  EXPECT_EQ(pool.num_free(), 10);
  EXPECT_EQ(pool.num_used(), 0);
  for (int32_t b = 0; b < 10; ++b) EXPECT_EQ(pool.ref_count(b), 0);
  BlockPool empty(0);
  EXPECT_EQ(empty.num_free(), 0);
  EXPECT_TRUE(empty.allocate(0).empty());
  expect_error([&] { empty.allocate(1); }, {"1 blocks", "0 of 0"});
}

TEST(BlockPool, RejectsABadSize) {
  expect_error([] { BlockPool p(-1); }, {"-1 blocks"});
  expect_error([] { BlockPool p(int64_t(1) << 40); }, {"out of range"});
}

TEST(BlockPool, AllocatesLowestFirstWithOneReference) {
  BlockPool pool(8);
  EXPECT_EQ(pool.allocate(3), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(pool.allocate(2), (std::vector<int32_t>{3, 4}));
  EXPECT_EQ(pool.num_used(), 5);
  EXPECT_EQ(pool.num_free(), 3);
  for (int32_t b = 0; b < 5; ++b) EXPECT_EQ(pool.ref_count(b), 1);
  for (int32_t b = 5; b < 8; ++b) EXPECT_TRUE(pool.is_free(b));
  EXPECT_TRUE(pool.allocate(0).empty());
  EXPECT_EQ(pool.num_used(), 5);
}

TEST(BlockPool, AllocationIsAllOrNothing) {
  BlockPool pool(6);
  pool.allocate(4);
  expect_error([&] { pool.allocate(3); }, {"cannot allocate 3 blocks", "only 2 of 6 are free"});
  EXPECT_EQ(pool.num_free(), 2) << "a refused allocation took blocks";
  EXPECT_TRUE(pool.is_free(4));
  EXPECT_TRUE(pool.is_free(5));
  EXPECT_EQ(pool.allocate(2), (std::vector<int32_t>{4, 5}));
  EXPECT_EQ(pool.num_free(), 0);
  expect_error([&] { pool.allocate(1); }, {"cannot allocate 1 blocks", "only 0 of 6"});
  expect_error([&] { pool.allocate(-2); }, {"-2 blocks"});
}

TEST(BlockPool, ReleasedBlocksAreReusedLeastRecentlyFreedFirst) {
  BlockPool pool(4);
  pool.allocate(4);
  EXPECT_TRUE(pool.release(2));
  EXPECT_TRUE(pool.release(0));
  EXPECT_EQ(pool.num_free(), 2);
  // 2 was freed first, so it is reused first: freed blocks age in order.
  EXPECT_EQ(pool.allocate(1), (std::vector<int32_t>{2}));
  EXPECT_TRUE(pool.release(3));
  EXPECT_EQ(pool.allocate(2), (std::vector<int32_t>{0, 3}));
  EXPECT_EQ(pool.num_free(), 0);
}

TEST(BlockPool, ReferenceCountsKeepSharedBlocksInUse) {
  BlockPool pool(3);
  const auto b = pool.allocate(1)[0];
  pool.retain(b);
  pool.retain(b);
  EXPECT_EQ(pool.ref_count(b), 3);
  EXPECT_FALSE(pool.release(b));
  EXPECT_FALSE(pool.release(b));
  EXPECT_EQ(pool.ref_count(b), 1);
  EXPECT_EQ(pool.num_used(), 1);
  EXPECT_TRUE(pool.release(b));
  EXPECT_EQ(pool.ref_count(b), 0);
  EXPECT_EQ(pool.num_free(), 3);
}

TEST(BlockPool, TakeRevivesAFreeBlock) {
  BlockPool pool(4);
  pool.allocate(4);
  pool.release(1);
  pool.release(3);
  pool.release(0);
  pool.take(3);  // out of the middle of the free list
  EXPECT_EQ(pool.ref_count(3), 1);
  EXPECT_EQ(pool.num_free(), 2);
  EXPECT_EQ(pool.allocate(2), (std::vector<int32_t>{1, 0}));
  pool.release(2);
  pool.take(2);  // the only free block: head and tail at once
  EXPECT_EQ(pool.num_free(), 0);
  expect_error([&] { pool.take(2); }, {"take of block 2", "in use", "1 references"});
}

TEST(BlockPool, MisuseNamesTheBlockAndThePool) {
  BlockPool pool(5);
  const auto b = pool.allocate(1)[0];
  pool.release(b);
  expect_error([&] { pool.release(b); }, {"release of block 0", "already free", "double free"});
  expect_error([&] { pool.retain(3); }, {"retain of block 3", "free"});
  expect_error([&] { pool.release(5); }, {"release of block 5", "out of range", "5 blocks"});
  expect_error([&] { pool.release(-1); }, {"block -1", "out of range"});
  expect_error([&] { pool.retain(99); }, {"retain of block 99", "out of range"});
  expect_error([&] { pool.take(7); }, {"take of block 7", "out of range"});
  expect_error([&] { (void)pool.ref_count(5); }, {"block 5", "out of range"});
  // Refused operations change nothing.
  EXPECT_EQ(pool.num_free(), 5);
  EXPECT_EQ(pool.allocate(5), (std::vector<int32_t>{1, 2, 3, 4, 0}));
}

// Random allocate / retain / release / take against a model: reference counts in a map and the free
// list as a deque in release order, so the pool's reuse order is checked exactly, not just counts.
TEST(BlockPool, RandomWalkMatchesAModel) {
  constexpr int32_t kBlocks = 64;
  BlockPool pool(kBlocks);
  std::map<int32_t, int32_t> refs;  // blocks in use -> references
  std::deque<int32_t> free_list;
  for (int32_t b = 0; b < kBlocks; ++b) free_list.push_back(b);
  std::mt19937_64 rng(20240611);
  auto pick_used = [&] {
    auto it = refs.begin();
    std::advance(it, std::uniform_int_distribution<size_t>(0, refs.size() - 1)(rng));
    return it->first;
  };
  for (int step = 0; step < 20000; ++step) {
    const int op = std::uniform_int_distribution<int>(0, 9)(rng);
    if (op < 4) {
      const int64_t n = std::uniform_int_distribution<int64_t>(0, 6)(rng);
      if (n > int64_t(free_list.size())) {
        EXPECT_THROW(pool.allocate(n), Error);
      } else {
        const auto got = pool.allocate(n);
        ASSERT_EQ(int64_t(got.size()), n);
        for (int32_t b : got) {
          ASSERT_EQ(b, free_list.front()) << "step " << step;
          free_list.pop_front();
          refs[b] = 1;
        }
      }
    } else if (op < 5 && !refs.empty()) {
      const int32_t b = pick_used();
      pool.retain(b);
      ++refs[b];
    } else if (op < 9 && !refs.empty()) {
      const int32_t b = pick_used();
      const bool freed = pool.release(b);
      ASSERT_EQ(freed, refs[b] == 1) << "step " << step;
      if (--refs[b] == 0) {
        refs.erase(b);
        free_list.push_back(b);
      }
    } else if (!free_list.empty()) {
      const size_t i = std::uniform_int_distribution<size_t>(0, free_list.size() - 1)(rng);
      const int32_t b = free_list[i];
      pool.take(b);
      free_list.erase(free_list.begin() + std::ptrdiff_t(i));
      refs[b] = 1;
    }
    ASSERT_EQ(pool.num_free(), int64_t(free_list.size())) << "step " << step;
    ASSERT_EQ(pool.num_used(), int64_t(refs.size())) << "step " << step;
    if (step % 97 == 0) {
      for (int32_t b = 0; b < kBlocks; ++b) {
        auto it = refs.find(b);
        ASSERT_EQ(pool.ref_count(b), it == refs.end() ? 0 : it->second) << "block " << b << " step " << step;
      }
    }
  }
  // Drain: releasing every reference frees everything, and the pool hands all blocks out again.
  for (auto& [b, r] : refs) {
    for (int32_t i = 0; i < r; ++i) pool.release(b);
  }
  EXPECT_EQ(pool.num_free(), kBlocks);
  const auto all = pool.allocate(kBlocks);
  EXPECT_EQ(std::set<int32_t>(all.begin(), all.end()).size(), size_t(kBlocks));
}

}  // namespace
}  // namespace tessera
