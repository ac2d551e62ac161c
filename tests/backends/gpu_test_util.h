// The fixture and helpers the GPU op tests share: a device backend of the parameter's name (skipped
// with the backend's own refusal when there is none), the CPU backend as the reference, inputs drawn
// fresh on each run (the seed is printed; TESSERA_TEST_SEED=<n> replays one), outputs poisoned (NaN)
// before each run with a poisoned guard after them.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "test_util.h"
#include "tessera/device_buffer.h"
#include "tessera/error.h"

namespace tessera::gpu_test {

inline constexpr size_t kGuard = 8;  // poisoned floats after every output

inline uint64_t run_seed() {
  static const uint64_t seed = [] {
    if (const char* env = std::getenv("TESSERA_TEST_SEED")) return uint64_t(std::strtoull(env, nullptr, 10));
    return (uint64_t(std::random_device{}()) << 32) | std::random_device{}();
  }();
  return seed;
}

inline std::string seed_note() { return "TESSERA_TEST_SEED=" + std::to_string(run_seed()) + " replays this run"; }

class GpuOps : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (test::plugins().find(ComponentKind::backend, GetParam()) == nullptr) {
      GTEST_SKIP() << "the " << GetParam() << " backend was not built";
    }
    try {
      gpu_ = test::plugins().create<Backend>(GetParam(), nlohmann::json::object(), "test");
    } catch (const Error& e) {
      GTEST_SKIP() << "no device: " << e.what();
    }
    rng_.seed(run_seed() ^ std::hash<std::string>{}(testing::UnitTest::GetInstance()->current_test_info()->name()));
  }

  Backend& gpu() { return *gpu_; }
  Backend& cpu() { return test::cpu_backend(); }

  std::vector<float> floats(size_t n, float lo = -1, float hi = 1) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng_);
    return v;
  }
  int64_t pick(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng_); }

  template <class T>
  DeviceBuffer up(Backend& b, const std::vector<T>& v, size_t extra = 0) {
    DeviceBuffer buf(b, std::max<size_t>(1, (v.size() + extra) * sizeof(T)));
    if (!v.empty()) b.copy_to_device(buf.get(), v.data(), v.size() * sizeof(T));
    return buf;
  }
  // n floats of NaN plus the guard.
  DeviceBuffer poisoned(Backend& b, size_t n) { return up(b, std::vector<float>(n + kGuard, std::nanf(""))); }
  // Reads n floats and checks the guard behind them.
  std::vector<float> read(Backend& b, const DeviceBuffer& buf, size_t n, bool guarded = true) {
    b.synchronize();
    std::vector<float> v(n + (guarded ? kGuard : 0));
    b.copy_to_host(v.data(), buf.get(), v.size() * sizeof(float));
    if (guarded) {
      for (size_t i = n; i < v.size(); ++i) EXPECT_TRUE(std::isnan(v[i])) << "wrote past the output at " << i;
      v.resize(n);
    }
    return v;
  }

  std::shared_ptr<Backend> gpu_;
  std::mt19937_64 rng_;
};

// |got - want| <= bound(i) everywhere (NaN fails); names the count and the first offender.
template <class Bound>
testing::AssertionResult close(const std::vector<float>& got, const std::vector<float>& want, Bound bound) {
  if (got.size() != want.size()) return testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(std::fabs(double(got[i]) - double(want[i])) <= bound(i))) {
      if (bad++ == 0) first = i;
    }
  }
  if (bad == 0) return testing::AssertionSuccess();
  return testing::AssertionFailure() << bad << " of " << got.size() << " differ; first [" << first << "] got "
                                     << got[first] << " want " << want[first] << " (allowed " << bound(first) << ")";
}

}  // namespace tessera::gpu_test
