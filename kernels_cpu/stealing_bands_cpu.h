// Splits units [0, n) (panels, bands or tiles of a weight) over an OpenMP team: each thread walks
// its own contiguous band front to back, and a thread whose band is done takes units from the back
// of the band with the most left. Decode's GEMVs are a memory stream whose speed differs between
// cores from one call to the next; with fixed bands the first thread done waited for the other
// at the join (with the barrier after quantizing x, waiting took a fifth of an int8 decode's thread
// time, a tenth after), while stealing keeps each thread's reads sequential until the bands meet.
// Compiled as C++17 (kernel sources).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#include "tessera/thread_team.h"

namespace tessera::cpu {

// A run of units [begin, end); empty when there is nothing left.
struct UnitRange {
  int64_t begin = 0, end = 0;
  bool empty() const { return begin >= end; }
};

class StealingBands {
 public:
  static constexpr int64_t kClaimDivisor = 8;

  StealingBands(int64_t n, int threads, int64_t claim_divisor = kClaimDivisor, int64_t claim_grain = 1)
      : bands_(size_t(threads)), divisor_(claim_divisor), grain_(claim_grain) {
    const int64_t per = (n + threads - 1) / threads;
    for (int t = 0; t < threads; ++t) {
      const int64_t b = std::min(n, per * t), e = std::min(n, per * (t + 1));
      bands_[size_t(t)].range.store(pack(b, e), std::memory_order_relaxed);
      bands_[size_t(t)].first = b;
    }
  }

  // The first unit of thread t's own band (n when the band is empty), as dealt before any claim.
  int64_t first_unit(int t) const { return bands_[size_t(t)].first; }

  // The next units for thread t: from the front of its own band a share of what is left there (an
  // eighth unless the caller chose another divisor, rounded down to whole multiples of the grain;
  // at least one grain or what is left; few claims while much is left, small ones as the bands
  // meet), else one unit from the back of the fullest band. Empty when every unit is taken.
  UnitRange next(int t) {
    if (size_t(t) < bands_.size()) {
      const UnitRange own = take(bands_[size_t(t)], true);
      if (!own.empty()) return own;
    }
    for (;;) {
      Band* victim = nullptr;
      int64_t most = 0;
      for (Band& b : bands_) {
        const uint64_t r = b.range.load(std::memory_order_relaxed);
        if (end_of(r) - begin_of(r) > most) most = end_of(r) - begin_of(r), victim = &b;
      }
      if (victim == nullptr) return {};
      const UnitRange stolen = take(*victim, false);
      if (!stolen.empty()) return stolen;
    }
  }

 private:
  struct alignas(64) Band {  // one cache line each: owners do not share theirs
    std::atomic<uint64_t> range{0};
    int64_t first = 0;  // as dealt
  };

  static uint64_t pack(int64_t b, int64_t e) { return uint64_t(b) << 32 | uint64_t(e); }
  static int64_t begin_of(uint64_t r) { return int64_t(r >> 32); }
  static int64_t end_of(uint64_t r) { return int64_t(r & 0xffffffffu); }

  UnitRange take(Band& band, bool front) const {
    uint64_t r = band.range.load(std::memory_order_relaxed);
    for (;;) {
      const int64_t b = begin_of(r), e = end_of(r);
      if (b >= e) return {};
      const int64_t count = front ? std::min(e - b, std::max(grain_, (e - b) / divisor_ / grain_ * grain_)) : 1;
      const uint64_t taken = front ? pack(b + count, e) : pack(b, e - 1);
      if (band.range.compare_exchange_weak(r, taken, std::memory_order_relaxed)) {
        return front ? UnitRange{b, b + count} : UnitRange{e - 1, e};
      }
    }
  }

  std::vector<Band> bands_;
  int64_t divisor_, grain_;
};

struct NoStreamStart {
  void operator()(int64_t) const {}
};

// body(begin, end) over runs of units covering [0, n) once, over the thread team, as above. Each
// thread first calls start(its band's first unit), where a decode requests the lines its stream
// begins with (prefetch_lines), unless its band is empty.
template <class Body, class Start = NoStreamStart>
void for_units(int64_t n, const Body& body, int64_t claim_divisor = StealingBands::kClaimDivisor,
               const Start& start = {}) {
  StealingBands units(n, team_max_threads(), claim_divisor);
  team_run([&](int t, int) {
    if (units.first_unit(t) < n) start(units.first_unit(t));
    for (UnitRange r; !(r = units.next(t)).empty();) body(r.begin, r.end);
  });
}

}  // namespace tessera::cpu
