// The benchmark's random numbers: a seeded 64-bit generator with its own distributions, so that a
// seed gives the same trace with every compiler and standard library (std::*_distribution do not
// promise that).
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

namespace tessera::bench {

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  // An independent stream per purpose: changing one aspect of a workload (say the arrival rate)
  // leaves the others (lengths, users, text) as they were.
  Rng(uint64_t seed, std::string_view stream) : state_(seed ^ hash(stream)) {}

  uint64_t next() {  // SplitMix64
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // [0, 1)
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }
  // [lo, hi], unbiased
  int64_t uniform_int(int64_t lo, int64_t hi) {
    const uint64_t range = uint64_t(hi - lo) + 1;
    if (range == 0) return int64_t(next());
    const uint64_t limit = UINT64_MAX - UINT64_MAX % range;
    uint64_t v;
    do v = next();
    while (v >= limit);
    return lo + int64_t(v % range);
  }
  double exponential(double rate) { return -std::log1p(-uniform()) / rate; }
  double normal(double mean, double stddev) {  // Box-Muller
    const double u1 = 1.0 - uniform(), u2 = uniform();
    return mean + stddev * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
  }

 private:
  static uint64_t hash(std::string_view s) {  // FNV-1a
    uint64_t h = 0xcbf29ce484222325ull;
    for (char c : s) h = (h ^ uint8_t(c)) * 0x100000001b3ull;
    return h;
  }
  uint64_t state_;
};

}  // namespace tessera::bench
