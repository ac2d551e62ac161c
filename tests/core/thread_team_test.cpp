// The thread team the CPU kernels run their parallel regions on (tessera/thread_team.h): every
// thread number runs once per region, at the same time as the others (a barrier inside a region
// returns only when all have reached it), the count follows OpenMP's setting, and a region started
// inside a region, from a second thread while one runs, or in a forked child runs on its caller alone.
#include "tessera/thread_team.h"

#include <gtest/gtest.h>
#include <omp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <vector>

namespace tessera {
namespace {

// Restores OpenMP's thread count for the calling thread when a test ends.
class ThreadCount {
 public:
  explicit ThreadCount(int n) : saved_(omp_get_max_threads()) { omp_set_num_threads(n); }
  ~ThreadCount() { omp_set_num_threads(saved_); }

 private:
  int saved_;
};

TEST(ThreadTeam, EveryThreadNumberRunsOnceOnItsOwnThread) {
  for (const int n : {3, 2, 4, 1}) {
    ThreadCount count(n);
    ASSERT_EQ(team_max_threads(), n);
    std::vector<int> runs(size_t(n), 0), sizes(size_t(n), 0);
    std::vector<std::thread::id> ids(static_cast<size_t>(n));
    team_run([&](int t, int nt) {
      ++runs[size_t(t)];
      sizes[size_t(t)] = nt;
      ids[size_t(t)] = std::this_thread::get_id();
      EXPECT_EQ(team_thread(), t);
      EXPECT_EQ(team_size(), nt);
    });
    for (int t = 0; t < n; ++t) {
      EXPECT_EQ(runs[size_t(t)], 1) << "thread " << t << " of " << n;
      EXPECT_EQ(sizes[size_t(t)], n);
      for (int u = 0; u < t; ++u) EXPECT_NE(ids[size_t(t)], ids[size_t(u)]) << "threads " << u << " and " << t;
    }
    EXPECT_EQ(ids[0], std::this_thread::get_id()) << "the caller is thread 0";
    EXPECT_EQ(team_size(), 1) << "outside a region";
    EXPECT_EQ(team_thread(), 0);
  }
}

TEST(ThreadTeam, ABarrierReturnsOnlyWhenEveryThreadHasReachedIt) {
  ThreadCount count(3);
  constexpr int kRounds = 2000;
  std::atomic<int> arrived{0};
  std::atomic<int> early{0};  // a thread past round r's barrier that saw fewer than all arrivals of round r
  team_run([&](int, int nt) {
    for (int r = 1; r <= kRounds; ++r) {
      arrived.fetch_add(1);
      team_barrier();
      if (arrived.load() < r * nt) early.fetch_add(1);
      team_barrier();  // nobody starts round r + 1 before everyone has checked round r
    }
  });
  EXPECT_EQ(arrived.load(), 3 * kRounds);
  EXPECT_EQ(early.load(), 0);
  team_barrier();  // outside a region: returns at once
}

TEST(ThreadTeam, ARegionInsideARegionRunsOnItsCallerAlone) {
  ThreadCount count(2);
  std::atomic<int> inner_runs{0};
  std::vector<int> outer_thread_after(2, -1);
  EXPECT_EQ(team_max_threads(), 2);
  team_run([&](int t, int) {
    EXPECT_EQ(team_max_threads(), 1) << "what a region started here gets, so kernels size their work for one";
    team_run([&](int it, int in) {
      EXPECT_EQ(it, 0);
      EXPECT_EQ(in, 1);
      EXPECT_EQ(team_size(), 1);
      inner_runs.fetch_add(1);
    });
    outer_thread_after[size_t(t)] = team_thread();
    EXPECT_EQ(team_size(), 2) << "the outer region's count is back";
  });
  EXPECT_EQ(inner_runs.load(), 2);
  EXPECT_EQ(outer_thread_after, (std::vector<int>{0, 1}));
}

TEST(ThreadTeam, RegionsFromManyThreadsAllComplete) {
  // Each host thread sums 0..n-1 over its regions; a region that lost or repeated a thread number
  // would change its sum.
  constexpr int kCallers = 4, kRegions = 500;
  std::vector<long> totals(kCallers, 0);
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&totals, c] {
      omp_set_num_threads(2);  // this host thread's own setting
      for (int i = 0; i < kRegions; ++i) {
        std::atomic<long> sum{0};
        std::atomic<int> size{0};
        team_run([&](int t, int nt) {
          sum.fetch_add(t);
          size.store(nt);
        });
        const int nt = size.load();
        totals[size_t(c)] += sum.load() == long(nt) * (nt - 1) / 2 ? 1 : 0;
      }
    });
  }
  for (std::thread& t : callers) t.join();
  for (int c = 0; c < kCallers; ++c) EXPECT_EQ(totals[size_t(c)], kRegions) << "caller " << c;
}

TEST(ThreadTeam, AForkedChildRunsRegionsOnItsOwnThread) {
  ThreadCount count(2);
  team_run([](int, int) {});  // the workers exist before the fork
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int seen = 0;
    team_run([&](int, int nt) { seen = nt; });
    _exit(seen == 1 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the child did not exit normally";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child's region did not run on its caller alone";
}

}  // namespace
}  // namespace tessera
