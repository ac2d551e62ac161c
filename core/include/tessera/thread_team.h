// The threads the CPU kernels' parallel regions run on: the caller and a pool of workers that
// spin between regions for a while (kIdleSpin) before they sleep. A decode token on the CPU forked
// ~60 regions (GEMVs, attention; now ~25, a layer's GEMVs in one, model_decode.cpp); an OpenMP
// region cost ~3.3 us to fork and join on the 2-vCPU VMs
// here where handing a region to a spinning worker and waiting for it costs ~0.75 us, and
// OpenMP's idle workers spin for milliseconds, taking the core from another process that shares it.
// The thread count is OpenMP's for the calling thread (OMP_NUM_THREADS, omp_set_num_threads), so
// the engine's `threads` option and the environment keep their meaning. Compiles as C++17 (the
// kernel sources include it).
#pragma once

#include <algorithm>
#include <cstdint>

namespace tessera {

// Threads a region started now from this thread gets (OpenMP's max threads for it; 1 inside a region).
int team_max_threads();

// Runs fn(ctx, t, n) for t = 0 .. n-1 at once, the caller being thread 0, and returns when every
// thread is done. n is team_max_threads(), or 1 (the caller alone) when called inside a region or
// while another thread's region runs. fn must not throw.
void team_run_raw(void (*fn)(void* ctx, int t, int n), void* ctx);

// body(t, n) as team_run_raw runs fn.
template <class Body>
void team_run(const Body& body) {
  team_run_raw([](void* ctx, int t, int n) { (*static_cast<const Body*>(ctx))(t, n); },
               const_cast<void*>(static_cast<const void*>(&body)));
}

// Inside a region: waits until every thread of it has called it. A no-op outside one.
void team_barrier();

// Inside a region: this thread's number and the region's thread count (0 and 1 outside one).
int team_thread();
int team_size();

// Thread t's part [begin, end) of n items dealt evenly over nt threads (empty past the end).
struct TeamSlice {
  int64_t begin, end;
};
inline TeamSlice team_slice(int64_t n, int t, int nt) {
  const int64_t per = (n + nt - 1) / nt;
  return {std::min(n, per * t), std::min(n, per * (t + 1))};
}

}  // namespace tessera
