#include "tessera/machine_probe.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tessera/error.h"

namespace tessera {
namespace {

TEST(MachineProbe, BandwidthTakesTheFasterOfOneAndFourStreams) {
  const ProbeResult r = measure_read_bandwidth(0.0, size_t(8) << 20);
  EXPECT_GT(r.value, 0.0);
  EXPECT_GE(r.threads, 1);
  // Passes alternate between the two patterns: at least two of each.
  EXPECT_NE(r.method.find("best of 4"), std::string::npos) << r.method;
  if (r.method.rfind("avx2", 0) == 0) EXPECT_NE(r.method.find("1 and 4 streams a thread"), std::string::npos) << r.method;
}

TEST(MachineProbe, AStreamCountOtherThanOneOrFourIsRefused) {
  std::vector<float> buf(size_t(1) << 16, 1.0f);
  for (int streams : kProbeStreams) EXPECT_NO_THROW(read_bandwidth_pass(buf.data(), buf.size(), streams));
  try {
    read_bandwidth_pass(buf.data(), buf.size(), 2);
    FAIL() << "2 streams accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("streams must be 1 or 4, not 2"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessera
