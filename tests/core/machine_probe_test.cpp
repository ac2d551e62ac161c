#include "tessera/machine_probe.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <string>
#include <vector>

#include "tessera/error.h"
#include "tessera/thread_team.h"

namespace tessera {
namespace {

TEST(MachineProbe, BandwidthTakesTheFastestOfThePatterns) {
  const ProbeResult r = measure_read_bandwidth(0.0, size_t(8) << 20);
  EXPECT_GT(r.value, 0.0);
  EXPECT_GE(r.threads, 1);
  // Passes cycle through the patterns: at least two of each.
  EXPECT_NE(r.method.find("best of " + std::to_string(2 * kProbePatternCount)), std::string::npos) << r.method;
  if (r.method.rfind("avx2", 0) == 0) {
    EXPECT_NE(r.method.find("1 and 4 streams a thread, 2 and 4 with 2 KiB prefetched ahead"), std::string::npos) << r.method;
  }
}

TEST(MachineProbe, EveryPatternReadsTheBufferAndAnUnknownOneIsRefused) {
  // Whatever the slices and the prefetch, each pattern reads every float of each thread's part
  // once: the same sink (two lanes of the sums) as one stream.
  std::vector<float> buf(size_t(1) << 16, 1.0f);
  for (int pattern = 0; pattern < kProbePatternCount; ++pattern) {
    EXPECT_EQ(read_bandwidth_pass(buf.data(), buf.size(), pattern), read_bandwidth_pass(buf.data(), buf.size(), 0))
        << "pattern " << pattern;
  }
  try {
    read_bandwidth_pass(buf.data(), buf.size(), kProbePatternCount);
    FAIL() << "pattern " << kProbePatternCount << " accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pattern must be 0 to 3, not 4"), std::string::npos) << e.what();
  }
}

TEST(MachineProbe, CoreRoundTripNeedsTwoThreadsAndTakesTime) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(2);
  const ProbeResult two = measure_core_round_trip(500);
  ProbeResult nested;  // from inside a region, whose thread 1 is busy
  team_run([&](int t, int) {
    if (t == 0) nested = measure_core_round_trip(500);
  });
  omp_set_num_threads(1);
  const ProbeResult one = measure_core_round_trip(500);
  omp_set_num_threads(saved);
  EXPECT_EQ(nested.threads, 1);
  EXPECT_EQ(nested.value, 0.0);
  EXPECT_EQ(two.threads, 2);
  // A line's way to another core and back: more than a few cycles, far less than a millisecond
  // (on one CPU the two threads take turns through yields: still bounded).
  EXPECT_GT(two.value, 1.0);
  EXPECT_LT(two.value, 1e6);
  EXPECT_NE(two.method.find("median of 5 passes of 100 round trips"), std::string::npos) << two.method;
  EXPECT_EQ(one.threads, 1);
  EXPECT_EQ(one.value, 0.0);
  EXPECT_NE(one.method.find("one thread"), std::string::npos) << one.method;
}

}  // namespace
}  // namespace tessera
