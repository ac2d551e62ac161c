#include "tessera/machine_probe.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <numeric>
#include <sstream>
#include <thread>
#include <vector>

#include "tessera/error.h"
#include "tessera/host_arena.h"
#include "tessera/thread_team.h"

namespace tessera {

namespace {

// The kernels carry their ISA as a function attribute and run only after a CPU check, so the
// library loads on any x86-64 (no AVX2 code outside these functions).
bool has_avx2_fma() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}

// Each thread sums its part as S slices read side by side, each with a software prefetch
// `prefetch_floats` ahead (0: none).
template <size_t S>
__attribute__((target("avx2"))) double sum_avx2(const float* p, size_t n, size_t prefetch_floats) {
  const size_t slice = n / S / 16 * 16;
  __m256 a[S][2];
  for (auto& acc : a) acc[0] = acc[1] = _mm256_setzero_ps();
  for (size_t i = 0; i < slice; i += 16) {
    for (size_t s = 0; s < S; ++s) {
      const float* line = p + s * slice + i;
      if (prefetch_floats != 0) _mm_prefetch(reinterpret_cast<const char*>(line + prefetch_floats), _MM_HINT_T0);
      a[s][0] = _mm256_add_ps(a[s][0], _mm256_load_ps(line));
      a[s][1] = _mm256_add_ps(a[s][1], _mm256_load_ps(line + 8));
    }
  }
  __m256 t = _mm256_setzero_ps();
  for (auto& acc : a) t = _mm256_add_ps(t, _mm256_add_ps(acc[0], acc[1]));
  alignas(32) float out[8];
  _mm256_store_ps(out, t);
  return double(out[0]) + out[7];
}

double sum_scalar(const float* p, size_t n) {
  float a[8] = {};
  for (size_t i = 0; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) a[j] += p[i + size_t(j)];
  }
  return double(a[0]) + a[7];
}

// 10 independent chains hide the FMA latency (4-5 cycles at 2 per cycle).
__attribute__((target("avx2,fma"))) float fma_chains_avx2(int64_t iters) {
  __m256 a[10];
  for (int i = 0; i < 10; ++i) a[i] = _mm256_set1_ps(float(i));
  const __m256 b = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(0.001f);
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < 10; ++i) a[i] = _mm256_fmadd_ps(a[i], b, c);
  }
  __m256 s = a[0];
  for (int i = 1; i < 10; ++i) s = _mm256_add_ps(s, a[i]);
  return _mm256_cvtss_f32(s);
}

// The same chains 16 lanes wide, where the CPU has AVX-512 (the f32 prefill tiles use it there).
__attribute__((target("avx512f"))) float fma_chains_avx512(int64_t iters) {
  __m512 a[10];
  for (int i = 0; i < 10; ++i) a[i] = _mm512_set1_ps(float(i));
  const __m512 b = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(0.001f);
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < 10; ++i) a[i] = _mm512_fmadd_ps(a[i], b, c);
  }
  __m512 s = a[0];
  for (int i = 1; i < 10; ++i) s = _mm512_add_ps(s, a[i]);
  return _mm512_cvtss_f32(s);
}

bool has_avx512f() {
  static const bool yes = has_avx2_fma() && __builtin_cpu_supports("avx512f");
  return yes;
}

float fma_chains_scalar(int64_t iters) {
  float a[10];
  for (int i = 0; i < 10; ++i) a[i] = float(i);
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < 10; ++i) a[i] = std::fma(a[i], 0.999f, 0.001f);
  }
  float s = 0;
  for (float v : a) s += v;
  return s;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

double read_bandwidth_pass(const float* data, size_t n, int pattern) {
  if (pattern < 0 || pattern >= kProbePatternCount) {
    throw Error("read_bandwidth_pass: pattern must be 0 to " + std::to_string(kProbePatternCount - 1) + ", not " +
                std::to_string(pattern));
  }
  const ProbePattern p = kProbePatterns[pattern];
  const size_t ahead = size_t(p.prefetch_bytes) / 4;
  const bool avx2 = has_avx2_fma();
  std::vector<double> sums(static_cast<size_t>(team_max_threads()));
  // On the thread team the kernels run on, so that the probe reads with the threads a decode does.
  team_run([&](int t, int nt) {
    const size_t per = n / size_t(nt) / 64 * 64;  // whole 16-float steps in each slice
    const float* part = data + per * size_t(t);
    sums[size_t(t)] = !avx2 ? sum_scalar(part, per)
                      : p.streams == 1 ? sum_avx2<1>(part, per, ahead)
                      : p.streams == 2 ? sum_avx2<2>(part, per, ahead)
                                       : sum_avx2<4>(part, per, ahead);
  });
  return std::accumulate(sums.begin(), sums.end(), 0.0);
}

double fma_peak_pass(int64_t iters, int* threads_out) {
  const bool avx2 = has_avx2_fma(), avx512 = has_avx512f();
  std::vector<float> sums(static_cast<size_t>(team_max_threads()));
  int threads = 1;
  team_run([&](int t, int nt) {
    sums[size_t(t)] = avx512 ? fma_chains_avx512(iters) : avx2 ? fma_chains_avx2(iters) : fma_chains_scalar(iters);
    if (t == 0) threads = nt;
  });
  const float sink = std::accumulate(sums.begin(), sums.end(), 0.0f);
  if (threads_out != nullptr) *threads_out = threads;
  // Keeps the chains alive without a volatile in the loop.
  if (sink == 12345.678f) std::abort();
  const double lanes = avx512 ? 16 : avx2 ? 8 : 1;
  return double(iters) * 10 * lanes * 2 * threads;
}

ProbeResult measure_read_bandwidth(double seconds, size_t bytes) {
  bytes = std::max<size_t>(bytes / 4096 * 4096, 4096);
  // On huge pages, as the CPU backend's weights are (host_arena.h), so that the probe reads memory
  // the way the GEMVs it is compared with do.
  auto unmap = [bytes](float* p) { unmap_huge_pages(p, bytes); };
  std::unique_ptr<float, decltype(unmap)> buf(static_cast<float*>(map_huge_pages(bytes)), unmap);
  if (!buf) throw Error("machine probe: cannot allocate " + std::to_string(bytes >> 20) + " MiB for the bandwidth test");
  std::memset(buf.get(), 1, bytes);  // touch every page before timing
  const size_t n = bytes / 4;
  ProbeResult r;
  r.threads = team_max_threads();
  const auto t0 = std::chrono::steady_clock::now();
  int passes = 0;
  do {
    const auto p0 = std::chrono::steady_clock::now();
    read_bandwidth_pass(buf.get(), n, passes % kProbePatternCount);
    const double s = seconds_since(p0);
    r.value = std::max(r.value, double(bytes) / s / 1e9);
    ++passes;
  } while (passes < 2 * kProbePatternCount || seconds_since(t0) < seconds);
  r.seconds = seconds_since(t0);
  r.method = std::string(has_avx2_fma() ? "avx2 loads, 1 and 4 streams a thread, 2 and 4 with 2 KiB prefetched ahead,"
                                        : "scalar loads") +
             " over " +
             std::to_string(bytes >> 20) + " MiB, best of " + std::to_string(passes);
  return r;
}

ProbeResult measure_fma_peak(double seconds) {
  ProbeResult r;
  const auto t0 = std::chrono::steady_clock::now();
  int passes = 0;
  int64_t iters = 1 << 18;
  do {
    const auto p0 = std::chrono::steady_clock::now();
    const double flops = fma_peak_pass(iters, &r.threads);
    const double s = seconds_since(p0);
    r.value = std::max(r.value, flops / s / 1e9);
    if (s < 0.02) iters *= 2;  // passes too short to time well
    ++passes;
  } while (passes < 3 || seconds_since(t0) < seconds);
  r.seconds = seconds_since(t0);
  r.method = std::string(has_avx512f()    ? "avx512 fma, 16 lanes"
                         : has_avx2_fma() ? "avx2 fma, 8 lanes"
                                          : "scalar fma") + ", 10 chains per thread, best of " +
             std::to_string(passes);
  return r;
}

ProbeResult measure_core_round_trip(int round_trips) {
  constexpr int kPasses = 5;
  const int per_pass = std::max(1, round_trips / kPasses);
  struct alignas(64) Line {
    std::atomic<int> turn{0};
  } line;
  // Spins, then yields between checks: a team with more threads than CPUs must still finish.
  auto wait_for = [&](int value) {
    for (unsigned i = 1; line.turn.load(std::memory_order_acquire) != value; ++i) {
      if (i < 4096) {
        _mm_pause();
      } else {
        std::this_thread::yield();
      }
    }
  };
  ProbeResult r;
  std::vector<double> ns;
  const auto t0 = std::chrono::steady_clock::now();
  for (int pass = 0; pass < kPasses; ++pass) {
    line.turn.store(0, std::memory_order_relaxed);
    double seconds = 0;
    int threads = 1;
    team_run([&](int t, int nt) {
      if (t == 0) threads = nt;
      if (nt < 2) return;  // one thread (or called inside another region): nobody to answer
      if (t == 1) {
        for (int i = 0; i < per_pass; ++i) {
          wait_for(2 * i + 1);
          line.turn.store(2 * i + 2, std::memory_order_release);
        }
      } else if (t == 0) {
        const auto p0 = std::chrono::steady_clock::now();
        for (int i = 0; i < per_pass; ++i) {
          line.turn.store(2 * i + 1, std::memory_order_release);
          wait_for(2 * i + 2);
        }
        seconds = seconds_since(p0);
      }
    });
    if (threads < 2) {
      r.threads = 1;
      r.method = "one thread: no other core to reach";
      return r;
    }
    ns.push_back(seconds / per_pass * 1e9);
  }
  std::sort(ns.begin(), ns.end());
  r.value = ns[kPasses / 2];
  r.threads = 2;
  r.seconds = seconds_since(t0);
  r.method = "a cache line between team threads 0 and 1, median of " + std::to_string(kPasses) + " passes of " +
             std::to_string(per_pass) + " round trips";
  return r;
}

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) {
        std::string name = line.substr(colon + 1);
        name.erase(0, name.find_first_not_of(" \t"));
        return name;
      }
    }
  }
  return "unknown";
}

size_t total_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  size_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit) {
    if (key == "MemTotal:") return kib * 1024;
  }
  return 0;
}

}  // namespace tessera
