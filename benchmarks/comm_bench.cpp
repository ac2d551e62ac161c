// The collectives a tensor-parallel step makes, timed through a communicator plugin, for the cost
// model in docs/distributed.md. Run it under MPI, one process per rank:
//   mpirun -n 2 build/bin/comm_bench [--comm mpi] [benchmark flags]
// BM_AllReduce/N: N floats summed over the ranks (a layer's o or down output: tokens x dim);
// BM_Broadcast/N: N bytes from rank 0 (a step's plan); BM_Gather/N: N floats from every rank to rank 0
// (a logits row's vocabulary shards). Iteration counts are fixed: every rank must make the same calls.
// Only rank 0 prints.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench_registry.h"
#include "tessera/communicator.h"

namespace {

tessera::Communicator* g_comm = nullptr;

void BM_AllReduce(benchmark::State& state) {
  std::vector<float> x(size_t(state.range(0)), 1.0f);
  for (auto _ : state) g_comm->all_reduce_sum(x.data(), x.size());
  state.SetBytesProcessed(int64_t(state.iterations()) * state.range(0) * 4);
  state.counters["ranks"] = g_comm->size();
}

void BM_Broadcast(benchmark::State& state) {
  std::vector<char> x(size_t(state.range(0)), 1);
  for (auto _ : state) g_comm->broadcast(x.data(), x.size(), 0);
  state.SetBytesProcessed(int64_t(state.iterations()) * state.range(0));
  state.counters["ranks"] = g_comm->size();
}

void BM_Gather(benchmark::State& state) {
  // As Model::gather_logits: each rank but 0 sends its shard, rank 0 receives them in rank order.
  std::vector<float> x(size_t(state.range(0)), 1.0f);
  for (auto _ : state) {
    if (g_comm->rank() == 0) {
      for (int r = 1; r < g_comm->size(); ++r) g_comm->recv(x.data(), x.size() * 4, r);
    } else {
      g_comm->send(x.data(), x.size() * 4, 0);
    }
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * state.range(0) * 4 * (g_comm->size() - 1));
  state.counters["ranks"] = g_comm->size();
}

// 768 / 2048 / 8192 floats: one token's row of the 110m / 1b / 70B shapes; x64 a prefill chunk.
BENCHMARK(BM_AllReduce)->Arg(768)->Arg(2048)->Arg(8192)->Arg(768 * 64)->Arg(2048 * 64)->Iterations(2000)->UseRealTime();
BENCHMARK(BM_Broadcast)->Arg(64)->Arg(4096)->Iterations(2000)->UseRealTime();
BENCHMARK(BM_Gather)->Arg(16000)->Arg(64000)->Iterations(1000)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  std::string plugin = "mpi";
  std::vector<char*> rest = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--comm") == 0 && i + 1 < argc) {
      plugin = argv[++i];
    } else {
      rest.push_back(argv[i]);
    }
  }
  const auto comm = tessera::bench::registry().create<tessera::Communicator>(plugin, nlohmann::json::object(), "comm_bench");
  g_comm = comm.get();
  if (comm->rank() != 0 && std::freopen("/dev/null", "w", stdout) == nullptr) return 1;
  int n = int(rest.size());
  benchmark::Initialize(&n, rest.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
