// StealingBands (kernels_cpu/stealing_bands_cpu.h), how the CPU GEMMs share a weight's rows: every
// unit is handed out exactly once whatever the team does, each thread walks its own band in order
// (its reads stay one sequential stream), and units of a band without a thread are still taken.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "stealing_bands_cpu.h"

namespace tessera::cpu {
namespace {

// Units each thread of a team of `team` got, in the order it got them.
std::vector<std::vector<int64_t>> hand_out(StealingBands& units, int team) {
  std::vector<std::vector<int64_t>> got(static_cast<size_t>(team));
#pragma omp parallel num_threads(team)
  {
    const int t = omp_get_thread_num();
    for (UnitRange r; !(r = units.next(t)).empty();) {
      for (int64_t u = r.begin; u < r.end; ++u) got[size_t(t)].push_back(u);
    }
  }
  return got;
}

TEST(StealingBands, EveryUnitGoesToExactlyOneThread) {
  for (int threads : {1, 2, 3, 8}) {
    for (int64_t n : {0, 1, 5, 64, 1001}) {
      for (const auto [divisor, grain] : {std::pair<int64_t, int64_t>{1, 1}, {2, 4}, {StealingBands::kClaimDivisor, 1}}) {
        SCOPED_TRACE("threads " + std::to_string(threads) + ", units " + std::to_string(n) + ", divisor " +
                     std::to_string(divisor) + ", grain " + std::to_string(grain));
        for (int round = 0; round < 20; ++round) {
          StealingBands units(n, threads, divisor, grain);
          std::vector<int64_t> all;
          for (const auto& g : hand_out(units, threads)) all.insert(all.end(), g.begin(), g.end());
          std::sort(all.begin(), all.end());
          std::vector<int64_t> want(static_cast<size_t>(n));
          for (int64_t i = 0; i < n; ++i) want[size_t(i)] = i;
          ASSERT_EQ(all, want);
          EXPECT_TRUE(units.next(0).empty()) << "all taken";
        }
      }
    }
  }
}

TEST(StealingBands, WhatAThreadTakesOfItsOwnBandIsItsFrontInOrder) {
  const int threads = 4;
  const int64_t n = 400;  // bands of 100
  for (int round = 0; round < 20; ++round) {
    StealingBands units(n, threads);
    const auto got = hand_out(units, threads);
    for (int t = 0; t < threads; ++t) {
      // A thread that starts late may find its band taken; what it does get of it is the front.
      int64_t expected = 100 * t;
      for (const int64_t u : got[size_t(t)]) {
        if (u >= 100 * t && u < 100 * (t + 1)) EXPECT_EQ(u, expected++) << "thread " << t;
      }
    }
  }
}

TEST(StealingBands, AThreadKnowsWhereItsBandBeginsWhateverIsTaken) {
  // What a decode thread prefetches before it claims (for_units' start hook): its band's first
  // unit as dealt, n for an empty band, unchanged by claims and thefts.
  StealingBands units(10, 4);  // bands of 3: [0, 3) [3, 6) [6, 9) [9, 10)
  const std::vector<int64_t> firsts = {0, 3, 6, 9};
  for (int t = 0; t < 4; ++t) EXPECT_EQ(units.first_unit(t), firsts[size_t(t)]);
  while (!units.next(0).empty()) {
  }
  for (int t = 0; t < 4; ++t) EXPECT_EQ(units.first_unit(t), firsts[size_t(t)]) << "after every unit is taken";
  EXPECT_EQ(StealingBands(2, 4).first_unit(3), 2) << "an empty band begins at n";
}

TEST(StealingBands, ForUnitsStartsEachThreadAtItsBandOnceBeforeItsUnits) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(3);
  for (const int64_t n : {int64_t(7), int64_t(2)}) {  // bands [0,3) [3,6) [6,7); [0,1) [1,2) [2,2)
    std::vector<std::vector<int64_t>> events(3);  // per thread: -1 - first for a start, then units
    for_units(
        n,
        [&](int64_t b, int64_t e) {
          for (int64_t u = b; u < e; ++u) events[size_t(team_thread())].push_back(u);
        },
        StealingBands::kClaimDivisor, [&](int64_t first) { events[size_t(team_thread())].push_back(-1 - first); });
    const int64_t per = (n + 2) / 3;
    std::vector<int64_t> units;
    for (int t = 0; t < 3; ++t) {
      const auto& ev = events[size_t(t)];
      const int64_t first = std::min(n, per * t);
      if (first == n) {
        EXPECT_TRUE(std::none_of(ev.begin(), ev.end(), [](int64_t e) { return e < 0; })) << "an empty band: no start";
      } else if (ev.empty()) {
        ADD_FAILURE() << "thread " << t << " did nothing";
      } else {
        EXPECT_EQ(ev.front(), -1 - first) << "thread " << t << " starts at its band before any unit";
        EXPECT_EQ(std::count_if(ev.begin(), ev.end(), [](int64_t e) { return e < 0; }), 1);
      }
      for (int64_t e : ev) {
        if (e >= 0) units.push_back(e);
      }
    }
    std::sort(units.begin(), units.end());
    std::vector<int64_t> want(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) want[size_t(i)] = i;
    EXPECT_EQ(units, want);
  }
  omp_set_num_threads(saved);
}

TEST(StealingBands, BandsWithoutAThreadAreStolen) {
  StealingBands units(90, 3);  // three bands, but only one thread asks
  std::vector<int64_t> got;
  for (UnitRange r; !(r = units.next(0)).empty();) {
    for (int64_t u = r.begin; u < r.end; ++u) got.push_back(u);
  }
  ASSERT_EQ(got.size(), 90u);
  for (int64_t i = 0; i < 30; ++i) EXPECT_EQ(got[size_t(i)], i) << "its own band first, in order";
  EXPECT_EQ(got[30], 59) << "then the (first) fullest band, from its end";
  EXPECT_EQ(got[31], 89) << "then the other, now the fullest";
}

TEST(StealingBands, AnOwnerClaimsAnEighthOfWhatIsLeftAndThievesOneUnit) {
  StealingBands units(160, 2);  // bands [0, 80) and [80, 160)
  UnitRange r = units.next(0);
  EXPECT_EQ(r.begin, 0);
  EXPECT_EQ(r.end, 10);
  r = units.next(0);
  EXPECT_EQ(r.begin, 10);
  EXPECT_EQ(r.end, 18);  // 70 left: 8
  while (units.next(0).begin < 80) {
  }
  // Thread 0 has finished its band and stole the last unit of thread 1's (the loop's last call).
  r = units.next(1);
  EXPECT_EQ(r.begin, 80) << "the owner still starts at its front";
  EXPECT_EQ(r.end, 89) << "an eighth of the 79 units left";
}

TEST(StealingBands, DivisorAndGrainChangeWhatAnOwnerClaimsNotWhatAThiefTakes) {
  StealingBands units(160, 2, 2, 4);  // decode's int8 GEMV: halves, in whole groups of 4 panels
  UnitRange r = units.next(0);
  EXPECT_EQ(r.begin, 0);
  EXPECT_EQ(r.end, 40);
  r = units.next(0);
  EXPECT_EQ(r.end, 60);  // 40 left: 20
  r = units.next(0);
  EXPECT_EQ(r.end, 68);  // 20 left: 10, rounded down to 8
  r = units.next(0);
  EXPECT_EQ(r.end, 72);  // 12 left: 6, rounded down to 4
  r = units.next(0);
  EXPECT_EQ(r.end, 76);  // 8 left: 4
  r = units.next(0);
  EXPECT_EQ(r.end, 80) << "never less than the grain while the band has it";
  r = units.next(0);
  EXPECT_EQ(r.begin, 159) << "a thief takes one unit, whatever the grain";
  EXPECT_EQ(r.end, 160);
  r = units.next(1);
  EXPECT_EQ(r.begin, 80);
  EXPECT_EQ(r.end, 116) << "half of the 79 units left, rounded down to 36";
}

}  // namespace
}  // namespace tessera::cpu
