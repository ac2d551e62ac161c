#include "tessera/host_arena.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <random>
#include <thread>
#include <vector>

namespace tessera {
namespace {

constexpr size_t kMiB = size_t(1) << 20;
constexpr size_t kSlab = 4 * kMiB;
constexpr size_t kMin = 64 << 10;

uintptr_t addr(const void* p) { return reinterpret_cast<uintptr_t>(p); }

TEST(HugePages, MappingsAreWholeAlignedHugePages) {
  void* p = map_huge_pages(3 * kMiB);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(addr(p) % kHugePageBytes, 0u);
  std::memset(p, 7, 4 * kMiB);  // rounded up to two huge pages, all of them usable
  EXPECT_EQ(static_cast<unsigned char*>(p)[4 * kMiB - 1], 7);
  unmap_huge_pages(p, 3 * kMiB);
}

// AnonHugePages of the mapping holding `p`, in KiB, from /proc/self/smaps (0 when not found).
size_t anon_huge_kib_at(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > line.find('-')) {
      inside = addr(p) >= lo && addr(p) < hi;
    } else if (inside && line.rfind("AnonHugePages:", 0) == 0) {
      return std::stoul(line.substr(14));
    }
  }
  return 0;
}

// A malloc'd matrix moved onto huge pages keeps every byte, and (where the kernel takes the
// request) its whole 2 MiB-aligned interior is then huge pages.
TEST(HugePages, AWrittenBufferMovesOntoHugePagesIntact) {
  const size_t bytes = 9 * kMiB + 12345;
  std::vector<uint8_t> buf(bytes);
  std::mt19937 rng(3);
  for (auto& b : buf) b = uint8_t(rng());
  const std::vector<uint8_t> copy = buf;
  const bool moved = back_with_huge_pages(buf.data(), bytes);
  EXPECT_EQ(buf, copy);
  if (!moved) GTEST_SKIP() << "this kernel did not collapse the range (MADV_COLLAPSE needs Linux 6.1 and free huge pages)";
  EXPECT_GE(anon_huge_kib_at(buf.data() + 2 * kMiB), 3 * kHugePageBytes / 1024);  // 3 or 4 lie inside 9 MiB
  EXPECT_FALSE(back_with_huge_pages(buf.data(), kMiB)) << "no aligned 2 MiB inside 1 MiB";
}

TEST(HostArena, MediumBlocksShareOneAlignedSlab) {
  HostArena arena(kSlab, kMin);
  void* a = arena.allocate(100 << 10);
  void* b = arena.allocate(300 << 10);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(arena.mapped_bytes(), kSlab);
  EXPECT_EQ(addr(a) % kHugePageBytes, 0u);  // the first block starts the slab
  EXPECT_EQ(addr(b) % 64, 0u);
  EXPECT_EQ(addr(b), addr(a) + (100 << 10));  // packed, not one mapping each
  std::memset(a, 1, 100 << 10);
  std::memset(b, 2, 300 << 10);
  EXPECT_EQ(static_cast<unsigned char*>(a)[(100 << 10) - 1], 1);
  arena.deallocate(a);
  arena.deallocate(b);
}

TEST(HostArena, SmallAndLargeBlocksComeFromMalloc) {
  HostArena arena(kSlab, kMin);
  void* small = arena.allocate(1000);
  void* large = arena.allocate(kSlab);  // over half a slab: a KV pool, say
  ASSERT_NE(small, nullptr);
  ASSERT_NE(large, nullptr);
  EXPECT_EQ(addr(small) % 64, 0u);
  EXPECT_EQ(addr(large) % 64, 0u);
  EXPECT_EQ(arena.mapped_bytes(), 0u);
  std::memset(large, 3, kSlab);
  arena.deallocate(small);
  arena.deallocate(large);
  arena.deallocate(nullptr);
}

TEST(HostArena, FreedBlocksAreReusedAndCoalesced) {
  HostArena arena(kSlab, kMin);
  void* a = arena.allocate(kMiB);
  void* b = arena.allocate(kMiB);
  void* c = arena.allocate(kMiB);
  arena.deallocate(b);
  EXPECT_EQ(arena.allocate(kMiB), b);  // first fit takes the hole
  arena.deallocate(a);
  arena.deallocate(b);
  void* ab = arena.allocate(2 * kMiB);  // a and b's holes merged
  EXPECT_EQ(ab, a);
  EXPECT_EQ(arena.mapped_bytes(), kSlab);
  arena.deallocate(ab);
  arena.deallocate(c);
}

TEST(HostArena, KeepsOneEmptySlabAndUnmapsTheRest) {
  HostArena arena(kSlab, kMin);
  std::vector<void*> blocks;
  for (int i = 0; i < 6; ++i) blocks.push_back(arena.allocate(kSlab / 2));  // two per slab
  EXPECT_EQ(arena.mapped_bytes(), 3 * kSlab);
  for (void* p : blocks) arena.deallocate(p);
  EXPECT_EQ(arena.mapped_bytes(), kSlab);
  // A buffer made and freed each step stays in the kept slab.
  for (int i = 0; i < 100; ++i) arena.deallocate(arena.allocate(kMiB));
  EXPECT_EQ(arena.mapped_bytes(), kSlab);
}

TEST(HostArena, ThreadsGetDisjointBlocks) {
  HostArena arena(kSlab, kMin);
  constexpr int kThreads = 4;
  std::vector<int> failures(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(uint32_t(t + 1));
      std::uniform_int_distribution<size_t> size(kMin, 512 << 10);
      std::vector<std::pair<unsigned char*, size_t>> live;
      for (int i = 0; i < 300; ++i) {
        if (!live.empty() && rng() % 3 == 0) {
          auto [p, n] = live[rng() % live.size()];
          for (size_t o = 0; o < n; o += 4096) failures[size_t(t)] += p[o] != (unsigned char)(t + 1);
          failures[size_t(t)] += p[n - 1] != (unsigned char)(t + 1);
          arena.deallocate(p);
          live.erase(std::find(live.begin(), live.end(), std::make_pair(p, n)));
        } else {
          const size_t n = size(rng);
          auto* p = static_cast<unsigned char*>(arena.allocate(n));
          if (p == nullptr) {
            ++failures[size_t(t)];
            continue;
          }
          std::memset(p, t + 1, n);
          live.emplace_back(p, n);
        }
      }
      for (auto [p, n] : live) {
        failures[size_t(t)] += p[0] != (unsigned char)(t + 1) || p[n - 1] != (unsigned char)(t + 1);
        arena.deallocate(p);
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[size_t(t)], 0) << "thread " << t;
  EXPECT_EQ(arena.mapped_bytes(), kSlab);  // everything freed: the one kept slab
}

}  // namespace
}  // namespace tessera
