// This machine's limits, measured: read bandwidth from memory and the peak rate of fused
// multiply-adds, both over all threads. Benchmarks print them next to their figures so that a
// GB/s or GFLOP/s can be read as a share of what the hardware allows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tessera {

struct ProbeResult {
  double value = 0;     // GB/s (bandwidth) or GFLOP/s (FMA)
  double seconds = 0;   // time spent measuring
  int threads = 0;      // threads used (the thread team, thread_team.h)
  std::string method;   // e.g. "avx2 loads, 1 and 4 streams a thread, 2 and 4 with 2 KiB prefetched ahead, over 256 MiB, best of 8"
};

// Sums a buffer of `bytes` (far larger than the caches) with all threads, repeatedly for about
// `seconds`, and reports the best pass. Uses AVX2 when the CPU has it, passes cycling through the
// read patterns of kProbePatterns (which reads fastest depends on the host), plain loads otherwise.
ProbeResult measure_read_bandwidth(double seconds = 0.25, size_t bytes = size_t(256) << 20);

// Runs independent FMA chains in registers on all threads for about `seconds` (16-wide AVX-512 FMA
// when present, else 8-wide AVX2, else scalar fma) and reports the best pass in GFLOP/s (an FMA
// counts 2): the widest the CPU has, which the f32 prefill tiles also use.
ProbeResult measure_fma_peak(double seconds = 0.25);

// How long a cache line takes to go from the team's thread 0 to thread 1 and back (ns, the
// median of 5 passes of `round_trips` / 5 ping-pongs): what every fork, join and shared claim of a
// parallel GEMV waits for. On the 2-vCPU EPYC VMs here it tells the host's two placements apart:
// ~60-90 ns with both vCPUs on one CCD, where two threads read no faster than one (~35 GB/s), and
// ~350 ns on two CCDs, where they read 60-75 GB/s and an int4 decode's per-GEMV costs are largest.
// value 0 with one thread (threads 1).
ProbeResult measure_core_round_trip(int round_trips = 2000);

// One pass of each kernel, for callers (Google Benchmark) that do their own timing:
// read_bandwidth_pass sums `n` floats with all threads, each reading its part as kProbePatterns[pattern]
// says; fma_peak_pass runs `iters` chain steps per thread and returns the floating-point operations it did.
struct ProbePattern {
  int streams;         // slices a thread reads side by side
  int prefetch_bytes;  // software prefetch this far ahead in each (0: the hardware prefetcher alone)
};
// The limit the kernels are compared with is the best the machine reads, so the probe tries the
// patterns the decode kernels use: on AMD EPYC VMs one or four streams with no prefetch read
// fastest (by 1-12%, either way in different sessions), on a Xeon VM two or four streams with 2 KiB
// prefetched ahead over them (~42-47 GB/s where the other two read 36-39).
inline constexpr ProbePattern kProbePatterns[] = {{1, 0}, {4, 0}, {2, 1024}, {4, 512}};
inline constexpr int kProbePatternCount = int(sizeof(kProbePatterns) / sizeof(kProbePatterns[0]));
double read_bandwidth_pass(const float* data, size_t n, int pattern);
double fma_peak_pass(int64_t iters, int* threads_out = nullptr);

// The CPU as /proc/cpuinfo names it ("AMD EPYC 7B13"), or "unknown".
std::string cpu_model_name();
// Physical memory (MemTotal), 0 when unknown.
size_t total_memory_bytes();

}  // namespace tessera
