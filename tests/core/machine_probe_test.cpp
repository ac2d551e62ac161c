#include "tessera/machine_probe.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tessera/error.h"

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

}  // namespace
}  // namespace tessera
