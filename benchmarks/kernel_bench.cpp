// Kernel microbenchmarks (Google Benchmark): GEMV (decode, m = 1) and GEMM (prefill, m = 128) for
// every weight scheme, made through the real quantizer plugins on the CPU backend, reported as
// weight GB/s and GFLOP/s; GEMVs streaming from memory (BM_GemvStream; two schemes called in turn,
// BM_GemvStreamVs; small and large GEMVs of one scheme in turn, BM_GemvSizesVs) and a 110m decode
// step's GEMVs separate and fused (BM_GemvLayers); plus this
// machine's limits — read bandwidth and FMA peak — so that every figure can be read as a share of
// what the hardware allows.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "tessera/device_buffer.h"
#include "tessera/host_arena.h"
#include "tessera/machine_probe.h"
#include "tessera/quantize_blocks.h"
#include "bench_registry.h"
#include "tessera/registry.h"

namespace tessera {
namespace {

using bench::registry;

Backend& cpu() { return bench::cpu_backend(); }

struct Scheme {
  const char* label;
  const char* quantizer;
  nlohmann::json params;
  DType source;  // how the weight is stored in the "file"
};

const std::vector<Scheme>& schemes() {
  static const std::vector<Scheme> s = {
      {"f32", "none", nlohmann::json::object(), DType::F32},
      {"f16", "none", {{"dtype", "f16"}}, DType::F32},
      {"int8", "int8", nlohmann::json::object(), DType::F32},
      {"int4-g32", "int4", {{"group_size", 32}}, DType::F32},
      {"gguf-q8_0", "gguf", nlohmann::json::object(), DType::Q8_0},
      {"gguf-q4_0", "gguf", nlohmann::json::object(), DType::Q4_0},
      {"gguf-q4_k", "gguf", nlohmann::json::object(), DType::Q4_K},
      {"gguf-q6_k", "gguf", nlohmann::json::object(), DType::Q6_K},
      // The int kernels without AVX-512 VNNI, beside the defaults above (which take it where the
      // CPU has it): the same weights and results, so the ratio is the instruction set's.
      {"int8-avx2", "int8", {{"kernel", "avx2"}}, DType::F32},
      {"int4-g32-avx2", "int4", {{"group_size", 32}, {"kernel", "avx2"}}, DType::F32},
      // pipelines/int4.yaml's scheme.
      {"int4-g32-asym", "int4", {{"group_size", 32}, {"scheme", "asymmetric"}}, DType::F32},
      // The other GGUF block formats (indices 11-18), quantized by Tessera's ggml-style quantizers.
      {"gguf-q2_k", "gguf", nlohmann::json::object(), DType::Q2_K},
      {"gguf-q3_k", "gguf", nlohmann::json::object(), DType::Q3_K},
      {"gguf-q5_k", "gguf", nlohmann::json::object(), DType::Q5_K},
      {"gguf-q4_1", "gguf", nlohmann::json::object(), DType::Q4_1},
      {"gguf-q5_0", "gguf", nlohmann::json::object(), DType::Q5_0},
      {"gguf-q5_1", "gguf", nlohmann::json::object(), DType::Q5_1},
      {"gguf-iq4_nl", "gguf", nlohmann::json::object(), DType::IQ4_NL},
      {"gguf-iq4_xs", "gguf", nlohmann::json::object(), DType::IQ4_XS},
      {"gguf-iq2_xxs", "gguf", nlohmann::json::object(), DType::IQ2_XXS},
      {"gguf-iq2_xs", "gguf", nlohmann::json::object(), DType::IQ2_XS},
      {"gguf-iq2_s", "gguf", nlohmann::json::object(), DType::IQ2_S},
      {"gguf-iq3_xxs", "gguf", nlohmann::json::object(), DType::IQ3_XXS},
      {"gguf-iq3_s", "gguf", nlohmann::json::object(), DType::IQ3_S},
  };
  return s;
}

bool scheme_built(benchmark::State& state, const Scheme& scheme) {
  if (registry().find(ComponentKind::quantizer, scheme.quantizer) != nullptr) return true;
  state.SkipWithError((std::string("quantizer plugin '") + scheme.quantizer + "' is not built").c_str());
  return false;
}

// A random n x k weight (normal, sd 0.05) as `scheme` stores it in a model file. The k-quants, which
// Tessera does not write, get random quants and sub-block scales under super-block scales (fp16)
// that keep the weights small.
std::vector<uint8_t> stored_weight(const Scheme& scheme, int64_t n, int64_t k, std::mt19937& rng) {
  if (scheme.source == DType::Q4_K || scheme.source == DType::Q6_K) {
    std::vector<uint8_t> stored(dtype_row_bytes(scheme.source, k) * size_t(n));
    for (auto& b : stored) b = uint8_t(rng());
    const size_t block = dtype_block_bytes(scheme.source);
    const uint16_t d = f32_to_fp16(1e-3f);
    for (size_t at = 0; at < stored.size(); at += block) {
      if (scheme.source == DType::Q4_K) {
        std::memcpy(&stored[at], &d, 2);      // d
        std::memcpy(&stored[at + 2], &d, 2);  // dmin
      } else {
        std::memcpy(&stored[at + 208], &d, 2);
      }
    }
    return stored;
  }
  std::normal_distribution<float> dist(0.0f, 0.05f);
  std::vector<float> w(size_t(n * k));
  for (auto& v : w) v = dist(rng);
  const size_t row_bytes = dtype_row_bytes(scheme.source, k);
  std::vector<uint8_t> stored(row_bytes * size_t(n));
  for (int64_t r = 0; r < n; ++r) quantize_row(scheme.source, w.data() + r * k, stored.data() + size_t(r) * row_bytes, k);
  return stored;
}

// args: scheme index, m, n (rows), k (cols)
void BM_Gemm(benchmark::State& state) {
  const Scheme& scheme = schemes()[size_t(state.range(0))];
  const int64_t m = state.range(1), n = state.range(2), k = state.range(3);
  if (!scheme_built(state, scheme)) return;
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 0.05f);
  const std::vector<uint8_t> stored = stored_weight(scheme, n, k, rng);
  auto quantizer = registry().create<Quantizer>(scheme.quantizer, scheme.params, "benchmark");
  auto linear = quantizer->make_linear(cpu(), WeightSource{"blk.0.ffn_up.weight", scheme.source, stored.data(), n, k});
  DeviceBuffer x(cpu(), size_t(m * k) * 4), y(cpu(), size_t(m * n) * 4);
  std::vector<float> xs(size_t(m * k));
  for (auto& v : xs) v = dist(rng) * 20;
  x.upload(xs.data(), xs.size() * 4);
  for (auto _ : state) {
    linear->forward(x.as<float>(), m, y.as<float>());
    benchmark::ClobberMemory();
  }
  const double iters = double(state.iterations());
  state.counters["weight_GB"] = benchmark::Counter(double(linear->resident_bytes()) * iters / 1e9, benchmark::Counter::kIsRate);
  state.counters["GFLOP"] = benchmark::Counter(2.0 * double(m * n * k) * iters / 1e9, benchmark::Counter::kIsRate);
  state.SetLabel(std::string(scheme.label) + " (" + linear->format() + ", " + std::to_string(omp_get_max_threads()) + " threads)");
}

void gemm_args(benchmark::internal::Benchmark* b) {
  for (int s = 0; s < int(schemes().size()); ++s) {
    for (int64_t m : {1, 128}) {
      b->Args({s, m, 768, 768});
      b->Args({s, m, 2048, 768});
      b->Args({s, m, 768, 2048});
    }
  }
}
BENCHMARK(BM_Gemm)->Apply(gemm_args)->Unit(benchmark::kMicrosecond)->UseRealTime();

// Decode's real regime: GEMV (m = 1) over weights that do not fit in the caches. Enough n x k
// matrices (args: scheme, n, k, m) to fill ~160 MB of this scheme's bytes, walked in turn as a
// model's layers are, so each call streams its weights from memory; 2048x768 as a 110m layer's,
// 16384x2048 so large that per-call costs (fork, join, stream start) vanish; m = 4 and 16 as a
// batched decode step's. weight_GB/s over BM_MemoryReadBandwidth is the kernel's share of the
// decode roofline (the fastest of its patterns).
// n x k matrices of one scheme, at least `fill` bytes of them, and an m-row x for them.
struct StreamSet {
  std::vector<std::unique_ptr<Linear>> linears;
  size_t bytes = 0;
  DeviceBuffer x, y;

  StreamSet(const Scheme& scheme, int64_t n, int64_t k, int64_t m, size_t fill) {
    std::mt19937 rng(1);
    std::normal_distribution<float> dist(0.0f, 0.05f);
    const std::vector<uint8_t> stored = stored_weight(scheme, n, k, rng);
    auto quantizer = registry().create<Quantizer>(scheme.quantizer, scheme.params, "benchmark");
    while (bytes < fill) {
      linears.push_back(quantizer->make_linear(cpu(), WeightSource{"blk.0.ffn_up.weight", scheme.source, stored.data(), n, k}));
      bytes += linears.back()->resident_bytes();
    }
    x = DeviceBuffer(cpu(), size_t(m * k) * 4);
    y = DeviceBuffer(cpu(), size_t(m * n) * 4);
    std::vector<float> xs(static_cast<size_t>(m * k));
    for (auto& v : xs) v = dist(rng) * 20;
    x.upload(xs.data(), xs.size() * 4);
  }
  void pass(int64_t m) {
    for (auto& linear : linears) linear->forward(x.as<float>(), m, y.as<float>());
    benchmark::ClobberMemory();
  }
  // The GEMV (m = 1) through matrix i (wrapping around); returns the seconds it took.
  double timed(size_t i) {
    const auto t0 = std::chrono::steady_clock::now();
    linears[i % linears.size()]->forward(x.as<float>(), 1, y.as<float>());
    benchmark::ClobberMemory();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  std::string describe(const Scheme& scheme) const {
    return std::string(scheme.label) + " (" + linears.front()->format() + ")";
  }
};

void BM_GemvStream(benchmark::State& state) {
  const Scheme& scheme = schemes()[size_t(state.range(0))];
  const int64_t n = state.range(1), k = state.range(2), m = state.range(3);
  if (!scheme_built(state, scheme)) return;
  StreamSet set(scheme, n, k, m, size_t(160) << 20);
  for (auto _ : state) set.pass(m);
  const double iters = double(state.iterations());
  state.counters["weight_GB"] = benchmark::Counter(double(set.bytes) * iters / 1e9, benchmark::Counter::kIsRate);
  state.counters["matrices"] = double(set.linears.size());
  state.SetLabel(set.describe(scheme) + ", " + std::to_string(omp_get_max_threads()) + " threads");
}
BENCHMARK(BM_GemvStream)
    ->ArgsProduct({benchmark::CreateDenseRange(0, 7, 1), {2048}, {768}, {1}})
    ->ArgsProduct({benchmark::CreateDenseRange(11, 23, 1), {2048}, {768}, {1}})  // the other GGUF formats
    ->ArgsProduct({{0, 2, 3}, {16384}, {2048}, {1}})
    ->ArgsProduct({{2, 3, 4}, {2048}, {768}, {4, 16}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Two schemes' GEMVs streaming from memory (args: scheme a, scheme b, n, k; m = 1), ~100 MB of
// each, called in turn (a's first matrix, b's first, a's second ...) and each call timed: both see
// the same moments of a host whose read bandwidth drifts, so b_over_a compares two kernels or
// layouts far more finely than two BM_GemvStream runs (whose probe figures differ from minute to
// minute). Rates in weight GB/s; probe_GB the read bandwidth measured after them.
void BM_GemvStreamVs(benchmark::State& state) {
  const Scheme& a = schemes()[size_t(state.range(0))];
  const Scheme& b = schemes()[size_t(state.range(1))];
  const int64_t n = state.range(2), k = state.range(3);
  if (!scheme_built(state, a) || !scheme_built(state, b)) return;
  StreamSet sa(a, n, k, 1, size_t(100) << 20), sb(b, n, k, 1, size_t(100) << 20);
  const size_t calls = std::max(sa.linears.size(), sb.linears.size());
  double ta = 0, tb = 0;
  for (auto _ : state) {
    double da = 0, db = 0;
    for (size_t i = 0; i < calls; ++i) {
      da += sa.timed(i);
      db += sb.timed(i);
    }
    ta += da;
    tb += db;
    state.SetIterationTime(da + db);
  }
  const double iters = double(state.iterations()) * double(calls);
  const double a_bytes = double(sa.bytes) / double(sa.linears.size()), b_bytes = double(sb.bytes) / double(sb.linears.size());
  state.counters["a_GB"] = a_bytes * iters / ta / 1e9;
  state.counters["b_GB"] = b_bytes * iters / tb / 1e9;
  state.counters["b_over_a"] = (b_bytes / tb) / (a_bytes / ta);
  state.counters["probe_GB"] = measure_read_bandwidth(0.15).value;
  state.counters["b_share"] = state.counters["b_GB"] / state.counters["probe_GB"];
  state.SetLabel("a " + sa.describe(a) + ", b " + sb.describe(b) + ", " + std::to_string(omp_get_max_threads()) +
                 " threads");
}
BENCHMARK(BM_GemvStreamVs)
    ->Args({2, 8, 2048, 768})    // int8: VNNI against AVX2
    ->Args({3, 9, 2048, 768})    // int4 sym: VNNI against AVX2
    ->Args({3, 10, 2048, 768})   // int4: symmetric against asymmetric
    ->Args({2, 10, 2048, 768})   // int8 against int4 asymmetric (pipelines/int8.yaml, int4.yaml)
    // Q4_0 (packed bands) against each other GGUF type (packed tiles): b_share is b's weight read
    // rate over the probe's, the type's share of the decode roofline.
    ->ArgsProduct({{5}, {4, 6, 7, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23}, {2048}, {768}})
    ->Iterations(30)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// One scheme's GEMVs of two shapes streaming from memory (args: scheme, n and k of a, n and k of
// b; ~100 MB of each), a 110m layer's against one so large that per-call costs vanish, called in
// turn by bytes (b's first matrix, then as many of a's as hold its bytes ...): b_over_a is what
// the per-call costs (fork and join, quantizing x, each thread's stream starting cold, the threads
// finishing apart) take from the small GEMVs, in the same moments of the host's bandwidth; a_us
// the small GEMV's time.
void BM_GemvSizesVs(benchmark::State& state) {
  const Scheme& s = schemes()[size_t(state.range(0))];
  if (!scheme_built(state, s)) return;
  StreamSet sa(s, state.range(1), state.range(2), 1, size_t(100) << 20);
  StreamSet sb(s, state.range(3), state.range(4), 1, size_t(100) << 20);
  const size_t per_b = sa.linears.size() / sb.linears.size();
  double ta = 0, tb = 0;
  for (auto _ : state) {
    double da = 0, db = 0;
    for (size_t i = 0, ia = 0; i < sb.linears.size(); ++i) {
      db += sb.timed(i);
      for (size_t j = 0; j < per_b; ++j, ++ia) da += sa.timed(ia);
    }
    ta += da;
    tb += db;
    state.SetIterationTime(da + db);
  }
  const double na = double(state.iterations() * int64_t(per_b * sb.linears.size()));
  const double nb = double(state.iterations() * int64_t(sb.linears.size()));
  const double a_bytes = double(sa.bytes) / double(sa.linears.size()), b_bytes = double(sb.bytes) / double(sb.linears.size());
  state.counters["a_GB"] = a_bytes * na / ta / 1e9;
  state.counters["b_GB"] = b_bytes * nb / tb / 1e9;
  state.counters["a_us"] = ta / na * 1e6;
  state.counters["b_over_a"] = (b_bytes * nb / tb) / (a_bytes * na / ta);
  state.counters["probe_GB"] = measure_read_bandwidth(0.15).value;
  state.SetLabel("a " + std::to_string(state.range(1)) + "x" + std::to_string(state.range(2)) + ", b " +
                 std::to_string(state.range(3)) + "x" + std::to_string(state.range(4)) + ", " + sa.describe(s) + ", " +
                 std::to_string(omp_get_max_threads()) + " threads");
}
BENCHMARK(BM_GemvSizesVs)
    ->Args({0, 2048, 768, 16384, 2048})   // f32
    ->Args({2, 2048, 768, 16384, 2048})   // int8
    ->Args({10, 2048, 768, 16384, 2048})  // int4 asymmetric (pipelines/int4.yaml)
    ->Iterations(10)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// A 110m decode step's GEMVs, 12 layers of q, k, v, o (768x768), gate, up (2048x768) and down
// (768x2048), against the same layers with q|k|v and gate|up concatenated (4 GEMVs a layer instead
// of 7): what fusing them would save in per-call costs (fork/join, quantizing x, stream ramp-up).
// args: scheme index, fused (0/1).
void BM_GemvLayers(benchmark::State& state) {
  const Scheme& scheme = schemes()[size_t(state.range(0))];
  const bool fused = state.range(1) == 1;
  if (!scheme_built(state, scheme)) return;
  auto quantizer = registry().create<Quantizer>(scheme.quantizer, scheme.params, "benchmark");
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 0.05f);
  const std::vector<std::pair<int64_t, int64_t>> shapes =
      fused ? std::vector<std::pair<int64_t, int64_t>>{{2304, 768}, {768, 768}, {4096, 768}, {768, 2048}}
            : std::vector<std::pair<int64_t, int64_t>>{{768, 768},  {768, 768},  {768, 768}, {768, 768},
                                                       {2048, 768}, {2048, 768}, {768, 2048}};
  std::vector<std::unique_ptr<Linear>> linears;
  size_t total = 0;
  for (int layer = 0; layer < 12; ++layer) {
    for (const auto& [n, k] : shapes) {
      const std::vector<uint8_t> stored = stored_weight(scheme, n, k, rng);
      linears.push_back(quantizer->make_linear(cpu(), WeightSource{"blk.0.ffn_up.weight", scheme.source, stored.data(), n, k}));
      total += linears.back()->resident_bytes();
    }
  }
  DeviceBuffer x(cpu(), 2048 * 4), y(cpu(), 4096 * 4);
  std::vector<float> xs(2048);
  for (auto& v : xs) v = dist(rng) * 20;
  x.upload(xs.data(), xs.size() * 4);
  for (auto _ : state) {
    for (auto& linear : linears) linear->forward(x.as<float>(), 1, y.as<float>());
    benchmark::ClobberMemory();
  }
  state.counters["weight_GB"] = benchmark::Counter(double(total) * double(state.iterations()) / 1e9, benchmark::Counter::kIsRate);
  state.SetLabel(std::string(scheme.label) + (fused ? " fused" : " separate"));
}
BENCHMARK(BM_GemvLayers)->ArgsProduct({{0, 2, 3, 4, 5}, {0, 1}})->Unit(benchmark::kMillisecond)->UseRealTime();

// Read bandwidth over a buffer far larger than the caches, all threads, each reading its part in
// one of the probe's patterns (arg: index in kProbePatterns): the passes `tessera bench` times for
// its conditions block, which takes the fastest.
void BM_MemoryReadBandwidth(benchmark::State& state) {
  const int pattern = int(state.range(0));
  const ProbePattern p = kProbePatterns[pattern];
  const size_t bytes = size_t(512) << 20;
  auto* buf = static_cast<float*>(map_huge_pages(bytes));  // as the CPU backend's weights
  if (buf == nullptr) {
    state.SkipWithError("cannot map 512 MiB for the bandwidth probe");
    return;
  }
  std::memset(buf, 1, bytes);
  double sink = 0;
  for (auto _ : state) sink += read_bandwidth_pass(buf, bytes / 4, pattern);
  benchmark::DoNotOptimize(sink);
  state.counters["GB"] = benchmark::Counter(double(bytes) * double(state.iterations()) / 1e9, benchmark::Counter::kIsRate);
  state.SetLabel(std::to_string(p.streams) + (p.streams == 1 ? " stream" : " streams") + " a thread" +
                 (p.prefetch_bytes == 0 ? "" : ", prefetch " + std::to_string(p.prefetch_bytes) + " B ahead in each"));
  unmap_huge_pages(buf, bytes);
}
BENCHMARK(BM_MemoryReadBandwidth)->DenseRange(0, kProbePatternCount - 1)->Unit(benchmark::kMillisecond)->UseRealTime();

// FMA peak: independent FMA chains in registers, all threads.
void BM_FmaPeak(benchmark::State& state) {
  double flops = 0;
  for (auto _ : state) flops += fma_peak_pass(1 << 22);
  state.counters["GFLOP"] = benchmark::Counter(flops / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_FmaPeak)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace tessera

BENCHMARK_MAIN();
