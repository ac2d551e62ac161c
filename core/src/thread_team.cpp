#include "tessera/thread_team.h"

#include <omp.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace tessera {

namespace {

using Clock = std::chrono::steady_clock;

// An idle worker spins this long after a region before it sleeps: a decode step's regions follow
// one another within microseconds, a token's sampling and scheduling within ~0.1 ms.
constexpr auto kIdleSpin = std::chrono::microseconds(200);
// A thread waiting for the others (join, barrier) spins this long, then yields between checks, so
// that on a shared core the thread it waits for gets to run.
constexpr auto kWaitSpin = std::chrono::microseconds(50);
// With more threads than CPUs a spinning thread takes the CPU from one that works (an int8 decode
// with 4 threads on 2 CPUs ran at 0.45x OpenMP's speed): nobody spins then.
constexpr auto kNoSpin = std::chrono::microseconds(0);

int available_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1, int(std::thread::hardware_concurrency()));
}

inline void relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Spins until done(); past `spin`, yields the core between checks (yield) or returns false (sleep).
template <class Done>
bool spin_until(const Done& done, Clock::duration spin, bool yield) {
  const auto start = Clock::now();
  for (unsigned i = 1;; ++i) {
    if (done()) return true;
    relax();
    if (i % 64 == 0 && Clock::now() - start > spin) {
      if (!yield) return false;
      while (!done()) std::this_thread::yield();
      return true;
    }
  }
}

thread_local int t_thread = 0;
thread_local int t_size = 1;

// The region's function and context; written by the caller before it publishes the region (the
// release of `start_`), read by the workers it runs on after they see it.
struct Region {
  void (*fn)(void*, int, int) = nullptr;
  void* ctx = nullptr;
};

class Team {
 public:
  ~Team() {
    if (abandoned_) return;  // a forked child: its workers are not in this process
    {
      std::lock_guard<std::mutex> lock(sleep_mutex_);
      stopping_ = true;
      start_.fetch_add(kRegionStep, std::memory_order_seq_cst);
    }
    wake_.notify_all();
    for (std::thread& w : workers_) w.join();
  }

  void run(void (*fn)(void*, int, int), void* ctx) {
    const int n = omp_get_max_threads();
    if (n <= 1 || t_size > 1 || abandoned_ || !busy_.try_lock()) {
      run_alone(fn, ctx);
      return;
    }
    std::lock_guard<std::mutex> lock(busy_, std::adopt_lock);
    while (int(workers_.size()) < n - 1) {
      const int index = int(workers_.size()) + 1;
      workers_.emplace_back([this, index] { work(index); });
    }
    region_ = {fn, ctx};
    if (spin_.load(std::memory_order_relaxed) != (n <= cpus_)) spin_.store(n <= cpus_, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    // The region's thread count travels with its number: a worker beyond it reads nothing else.
    const uint64_t next = (start_.load(std::memory_order_relaxed) & ~kCountMask) + kRegionStep + uint64_t(n);
    start_.store(next, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> wake_lock(sleep_mutex_);
      wake_.notify_all();
    }
    t_thread = 0;
    t_size = n;
    fn(ctx, 0, n);
    t_size = 1;
    spin_until([&] { return done_.load(std::memory_order_acquire) == n - 1; }, wait_spin(), true);
  }

  void barrier() {
    const int n = t_size;
    if (n <= 1) return;
    const uint64_t generation = barrier_generation_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) == n - 1) {
      arrived_.store(0, std::memory_order_relaxed);
      barrier_generation_.store(generation + 1, std::memory_order_release);
      return;
    }
    spin_until([&] { return barrier_generation_.load(std::memory_order_acquire) != generation; }, wait_spin(), true);
  }

  // After fork() the child has the caller's thread alone: its regions run on it.
  void abandon() { abandoned_ = true; }

 private:
  static constexpr uint64_t kCountMask = 0xffff;
  static constexpr uint64_t kRegionStep = kCountMask + 1;

  static void run_alone(void (*fn)(void*, int, int), void* ctx) {
    const int saved_thread = t_thread, saved_size = t_size;
    t_thread = 0;
    t_size = 1;
    fn(ctx, 0, 1);
    t_thread = saved_thread;
    t_size = saved_size;
  }

  Clock::duration wait_spin() const { return spin_.load(std::memory_order_relaxed) ? kWaitSpin : kNoSpin; }

  void work(int index) {
    uint64_t seen = 0;
    for (;;) {
      auto started = [&] { return start_.load(std::memory_order_acquire) != seen; };
      const Clock::duration idle_spin = spin_.load(std::memory_order_relaxed) ? kIdleSpin : kNoSpin;
      if (!spin_until(started, idle_spin, false)) {
        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        {
          std::unique_lock<std::mutex> lock(sleep_mutex_);
          wake_.wait(lock, [&] { return start_.load(std::memory_order_seq_cst) != seen; });
        }
        sleepers_.fetch_sub(1, std::memory_order_relaxed);
      }
      seen = start_.load(std::memory_order_acquire);
      if (stopping_) return;
      const int n = int(seen & kCountMask);
      if (index >= n) continue;
      const Region region = region_;
      t_thread = index;
      t_size = n;
      region.fn(region.ctx, index, n);
      t_size = 1;
      done_.fetch_add(1, std::memory_order_release);
    }
  }

  std::mutex busy_;  // held by the thread whose region runs
  std::vector<std::thread> workers_;
  Region region_;
  bool abandoned_ = false;
  const int cpus_ = available_cpus();
  // The last region had no more threads than CPUs. Written only when that changes: the workers
  // read it after every region.
  std::atomic<bool> spin_{true};
  bool stopping_ = false;  // written under sleep_mutex_ before the last start_
  std::mutex sleep_mutex_;
  std::condition_variable wake_;
  alignas(64) std::atomic<uint64_t> start_{0};  // regions started (high bits) and the last one's thread count
  alignas(64) std::atomic<int> done_{0};        // workers done with the running region
  alignas(64) std::atomic<int> sleepers_{0};
  alignas(64) std::atomic<int> arrived_{0};
  alignas(64) std::atomic<uint64_t> barrier_generation_{0};
};

Team& team() {
  static Team* const instance = [] {
    static Team t;
    pthread_atfork(nullptr, nullptr, [] { team().abandon(); });
    return &t;
  }();
  return *instance;
}

}  // namespace

// Inside a region a region runs on its caller alone (Team::run), so its code sizes its work for one.
int team_max_threads() { return t_size > 1 ? 1 : omp_get_max_threads(); }

void team_run_raw(void (*fn)(void*, int, int), void* ctx) { team().run(fn, ctx); }

void team_barrier() { team().barrier(); }

int team_thread() { return t_thread; }

int team_size() { return t_size; }

}  // namespace tessera
