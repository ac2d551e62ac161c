// Runs one pipeline on a trace: open loop (Poisson arrivals submitted by their own thread while
// this thread steps the engine) or closed loop (N clients, each submitting its next request when
// the previous one finishes), and records every request's timings and the memory it took.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "tessera/bench/trace.h"
#include "tessera/bench/workload.h"
#include "tessera/cache.h"
#include "tessera/engine.h"

namespace tessera::bench {

struct RunResult {
  std::vector<GenerationResult> results;  // by trace index
  std::vector<double> scheduled;          // engine-clock time each request was due (poisson)
  double start = 0;                       // engine clock: first submission
  double end = 0;                         // engine clock: last request finished
  EngineStats engine;
  CacheStats cache;                       // at the end of the run
  size_t kv_bytes_peak = 0;               // most KV bytes in use after any step
  int64_t kv_blocks_peak = 0;
  double seconds() const { return end - start; }
};

// Called on the stepping thread after every finished request.
using Progress = std::function<void(int64_t finished, int64_t total)>;

// Throws Error when the engine fails; requests that fail alone are returned with reason error.
RunResult run_trace(Pipeline& pipeline, const Trace& trace, const Workload& workload, const Progress& progress = {});

// This process's resident memory (Linux /proc/self/status): now, and the peak since start or since
// the last successful reset_peak_rss() (which writes 5 to /proc/self/clear_refs).
size_t current_rss_bytes();
size_t peak_rss_bytes();
bool reset_peak_rss();

}  // namespace tessera::bench
