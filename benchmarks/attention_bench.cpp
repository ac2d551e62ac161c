// Attention benchmarks (Google Benchmark) for long prompts:
//   BM_AttentionOp    one attention call over a whole prompt: the naive path (materialised score
//                     matrix per head) against the fused CPU kernel, dense and block-sparse.
//   BM_Prefill        whole-model prefill of one prompt through the engine with the `gqa` and
//                     `sparse` attention plugins (keep_ratio 0.25).
//   BM_Decode         decode tokens/s after a long prompt with each plugin (sparse decodes densely,
//                     so this should not move).
//   BM_DecodeAttentionCold  decode attention of a 110m-shaped model over a cold KV cache (f32, f16, bf16);
//                     BM_DecodeAttentionColdGqa the same with 4 kv heads (110m-gqa).
// The model is synthetic (long context, small width, so attention dominates as it does at long
// context in real models); it is written once to a temporary file. Shape: env TESSERA_BENCH_LONG_MODEL
// replaces it with any GGUF of context > 8192.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <random>

#include "bench_registry.h"
#include "tessera/attention.h"
#include "tessera/device_buffer.h"
#include "tessera/engine.h"
#include "tessera/pipeline.h"
#include "tessera/synth.h"
#include "tessera/thread_team.h"

namespace tessera {
namespace {

using bench::registry;

Backend& cpu() { return bench::cpu_backend(); }

const std::string& long_model() {
  static const std::string path = [] {
    if (const char* env = std::getenv("TESSERA_BENCH_LONG_MODEL"); env != nullptr && *env != '\0') {
      return std::string(env);
    }
    SynthSpec s;
    s.preset = "custom";
    s.dim = 256;
    s.ffn_dim = 688;
    s.n_layers = 4;
    s.n_heads = 4;
    s.n_kv_heads = 4;
    s.vocab = 512;
    s.context_length = 8704;  // room for an 8K prompt plus the decode benchmark's output
    s.seed = 3;
    const std::string file =
        (std::filesystem::temp_directory_path() / ("tessera_attention_bench_" + std::to_string(::getpid()) + ".gguf"))
            .string();
    write_synthetic_model(s, file);
    std::atexit([] { std::filesystem::remove(long_model()); });
    return file;
  }();
  return path;
}

// --- one attention call ----------------------------------------------------------------------

constexpr int64_t kHeads = 8, kKvHeads = 2, kHeadDim = 64, kBlock = 16;

struct OpData {
  explicit OpData(int64_t n) : n(n) {
    Backend& b = cpu();
    const int64_t blocks = (n + kBlock - 1) / kBlock;
    table.resize(size_t(blocks));
    for (int64_t i = 0; i < blocks; ++i) table[size_t(i)] = static_cast<int32_t>(blocks - 1 - i);
    std::mt19937_64 rng(5);
    std::uniform_real_distribution<float> d(-1, 1);
    q.resize(size_t(n * kHeads * kHeadDim));
    for (float& x : q) x = d(rng);
    k_rows.resize(size_t(n * kKvHeads * kHeadDim));
    v_rows.resize(k_rows.size());
    for (float& x : k_rows) x = d(rng);
    for (float& x : v_rows) x = d(rng);
    const size_t pool = size_t(blocks * kBlock * kKvHeads * kHeadDim);
    k = DeviceBuffer(b, pool * sizeof(float));
    v = DeviceBuffer(b, pool * sizeof(float));
    out.resize(q.size());
    desc = {0, int32_t(n), int32_t(n), 0};
    slots.resize(size_t(n));
    for (int64_t p = 0; p < n; ++p) slots[size_t(p)] = table[size_t(p / kBlock)] * int32_t(kBlock) + int32_t(p % kBlock);
    b.kv_write(kv(), k_rows.data(), v_rows.data(), slots.data(), n);  // for the naive path
  }
  KvLayerView kv() const {
    return {k.get(), v.get(), DType::F32, int64_t(table.size()), kBlock, kKvHeads, kHeadDim};
  }
  AttentionStep step() const {
    AttentionStep s;
    s.n_tokens = n;
    s.slots = slots.data();
    s.seqs = &desc;
    s.block_tables = table.data();
    s.host_seqs = std::span<const AttentionSeqDesc>(&desc, 1);
    s.max_q_len = s.max_context_len = int32_t(n);
    return s;
  }
  int64_t n;
  std::vector<int32_t> table, slots;
  std::vector<float> q, k_rows, v_rows, out;
  DeviceBuffer k, v;
  AttentionSeqDesc desc;
};

// The textbook path: the full causal score matrix of each head, softmax, then scores x V.
void naive_attention(const OpData& d) {
  const int64_t n = d.n, group = kHeads / kKvHeads;
  const float scale = 1.0f / std::sqrt(float(kHeadDim));
  const auto* kp = d.k.as<const float>();
  const auto* vp = d.v.as<const float>();
  auto row = [&](const float* pool, int64_t pos, int64_t h) {
    return pool + ((int64_t(d.table[size_t(pos / kBlock)]) * kBlock + pos % kBlock) * kKvHeads + h) * kHeadDim;
  };
  std::vector<float> s(size_t(n * n));
  std::vector<float> out(static_cast<size_t>(kHeadDim));
  for (int64_t h = 0; h < kHeads; ++h) {
    for (int64_t i = 0; i < n; ++i) {
      const float* q = d.q.data() + (i * kHeads + h) * kHeadDim;
      float* si = s.data() + i * n;
      float mx = -INFINITY;
      for (int64_t j = 0; j <= i; ++j) {
        const float* k = row(kp, j, h / group);
        float dot = 0;
        for (int64_t e = 0; e < kHeadDim; ++e) dot += q[e] * k[e];
        si[j] = dot * scale;
        mx = std::max(mx, si[j]);
      }
      float sum = 0;
      for (int64_t j = 0; j <= i; ++j) sum += (si[j] = std::exp(si[j] - mx));
      std::fill(out.begin(), out.end(), 0.0f);
      for (int64_t j = 0; j <= i; ++j) {
        const float* v = row(vp, j, h / group);
        for (int64_t e = 0; e < kHeadDim; ++e) out[size_t(e)] += si[j] * v[e];
      }
      benchmark::DoNotOptimize(out.data());
      (void)sum;
    }
  }
}

// Arg 0: context; arg 1: 0 naive, 1 gqa, 2 sparse (keep 0.25, block 64).
void BM_AttentionOp(benchmark::State& state) {
  const int64_t n = state.range(0);
  const int64_t path = state.range(1);
  OpData d(n);
  std::shared_ptr<Attention> att;
  if (path == 1) att = registry().create<Attention>("gqa", nlohmann::json::object(), "benchmark");
  if (path == 2) {
    att = registry().create<Attention>("sparse", {{"keep_ratio", 0.25}, {"min_context", 0}}, "benchmark");
  }
  if (att) att->configure({kHeads, kKvHeads, kHeadDim, 0});
  const AttentionStep step = d.step();
  for (auto _ : state) {
    if (att) {
      att->forward(cpu(), step, d.kv(), d.q.data(), d.k_rows.data(), d.v_rows.data(), d.out.data());
    } else {
      naive_attention(d);
    }
  }
  state.SetLabel(std::string(path == 0 ? "naive" : path == 1 ? "gqa" : "sparse keep 0.25") + ", heads 8/2 x 64");
  state.counters["tokens_per_s"] = benchmark::Counter(double(n), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_AttentionOp)
    ->ArgsProduct({{512, 1024, 2048, 4096}, {0, 1, 2}})
    ->ArgsProduct({{8192}, {1, 2}})
    ->Unit(benchmark::kMillisecond)
    ->MinTime(0.2);

// Decode attention as a 110m-shaped model meets it (12 layers of 12 heads of 64, one sequence in a
// contiguous cache of 1024 positions): each layer's K/V is cold, because a token's weights pass
// through the caches between two visits. Between layers the team reads 9 MiB, a layer's share of
// the int8 model's weights, as the GEMVs do: in parallel on the engine's thread team, so that its
// worker is spinning, not asleep, when attention forks. Each layer reads its own 9 MiB, as each
// layer has its own weights: one 9 MiB buffer read for every layer stayed in a 32 MiB L3 and
// evicted nothing from it, so the K/V came from L3 (40 and 128 keys 1.5-2x faster than in a
// decode). (Read in an OpenMP loop, as before the GEMVs moved to the team, OpenMP's threads spun
// on through the attention call: two teams on two cores, 128 keys ~12x slower than with
// OMP_WAIT_POLICY=passive.) A layer's K/V was last read 12 layers (108 MiB of other data) before,
// like the real decode's, while the attention code stays as warm as there.
// Per call this matches the region's time in an int8 110m decode (`scripts/omp_regions.sh`): ~10 us
// at 40 keys, ~40 at 128.
// (An earlier version read 8 MiB on one thread, a loop the compiler removed since it knew the
// buffer's contents: it timed attention over hot K/V, 2-2.5x faster.) Arg: context positions. Only
// the attention calls are timed; KV_GB is the K and V bytes they read.
void decode_attention_cold(benchmark::State& state, int64_t kv_heads) {
  const int64_t ctx = state.range(0);
  const DType dtype = state.range(1) == 0 ? DType::F32 : state.range(1) == 1 ? DType::F16 : DType::BF16;
  state.SetLabel(std::string("kv ") + std::string(dtype_name(dtype)) + ", 12 heads on " + std::to_string(kv_heads));
  constexpr int64_t kLayers = 12, kHeads = 12, kHeadDim = 64, kSlots = 1024;
  const size_t elem = dtype_row_bytes(dtype, 1);
  const size_t pool = size_t(kSlots * kv_heads * kHeadDim) * elem;
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> host(size_t(kSlots * kv_heads * kHeadDim));
  for (auto& v : host) v = dist(rng);
  std::vector<uint16_t> half(host.size());
  for (size_t i = 0; i < host.size(); ++i) half[i] = dtype == DType::F16 ? f32_to_fp16(host[i]) : f32_to_bf16(host[i]);
  const void* stored = dtype == DType::F32 ? static_cast<const void*>(host.data()) : half.data();
  std::vector<DeviceBuffer> k, v;
  for (int64_t l = 0; l < kLayers; ++l) {
    k.emplace_back(cpu(), pool);
    v.emplace_back(cpu(), pool);
    k.back().upload(stored, pool);
    v.back().upload(stored, pool);
  }
  std::vector<float> q(size_t(kHeads * kHeadDim)), out(q.size());
  for (auto& x : q) x = dist(rng) * 0.1f;
  constexpr size_t kEvictFloats = size_t(9) << 18;  // 9 MiB a layer
  std::vector<float> evict(kEvictFloats * kLayers, 1.0f);
  benchmark::DoNotOptimize(evict.data());  // its contents unknown to the compiler: the reads stay
  benchmark::ClobberMemory();
  const AttentionSeqDesc seq{0, 1, int32_t(ctx), 0};
  const int32_t table[1] = {0};
  double sink = 0;
  std::vector<double> sums(size_t(team_max_threads()), 0.0);  // each thread's eviction read
  for (auto _ : state) {
    double seconds = 0;
    for (int64_t l = 0; l < kLayers; ++l) {
      const float* slice = evict.data() + size_t(l) * kEvictFloats;
      const auto lines = static_cast<int64_t>(kEvictFloats / 16);
      team_run([&](int t, int nt) {
        const TeamSlice mine = team_slice(lines, t, nt);
        double sum = 0;
        for (int64_t i = mine.begin; i < mine.end; ++i) sum += slice[i * 16];
        sums[size_t(t)] = sum;
      });
      for (const double s : sums) sink += s;
      KvLayerView kv;
      kv.k = k[size_t(l)].get();
      kv.v = v[size_t(l)].get();
      kv.dtype = dtype;
      kv.num_blocks = 1;
      kv.block_size = kSlots;
      kv.n_kv_heads = kv_heads;
      kv.head_dim = kHeadDim;
      AttentionArgs a;
      a.q = q.data();
      a.out = out.data();
      a.n_tokens = 1;
      a.n_heads = kHeads;
      a.scale = 0.125f;
      a.seqs = &seq;
      a.n_seqs = 1;
      a.block_tables = table;
      a.max_q_len = 1;
      a.max_context_len = int32_t(ctx);
      const auto t0 = std::chrono::steady_clock::now();
      cpu().attention(a, kv);
      seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    state.SetIterationTime(seconds);
  }
  benchmark::DoNotOptimize(sink);
  const double bytes = double(kLayers * ctx * kv_heads * kHeadDim) * 2 * double(elem);
  state.counters["KV_GB"] = benchmark::Counter(bytes * double(state.iterations()) / 1e9, benchmark::Counter::kIsRate);
}
void BM_DecodeAttentionCold(benchmark::State& state) { decode_attention_cold(state, 12); }
// The same with 4 kv heads (110m-gqa's), each read by a group of 3 queries.
void BM_DecodeAttentionColdGqa(benchmark::State& state) { decode_attention_cold(state, 4); }
// Args: context, cache type (0 f32, 1 f16, 2 bf16).
BENCHMARK(BM_DecodeAttentionCold)
    ->ArgsProduct({{40, 128, 512}, {0, 1, 2}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_DecodeAttentionColdGqa)->ArgsProduct({{128, 512}, {0, 1}})->UseManualTime()->Unit(benchmark::kMicrosecond);

// --- whole model -----------------------------------------------------------------------------

std::unique_ptr<Pipeline> long_pipeline(bool sparse) {
  PipelineSpec spec = default_pipeline_spec();
  spec.model = long_model();
  spec.backend = "cpu";
  ComponentSpec att;
  att.plugin = sparse ? "sparse" : "gqa";
  if (sparse) att.params = {{"keep_ratio", 0.25}};
  att.where = "benchmark";
  spec.components[ComponentKind::attention] = att;
  ComponentSpec cache;
  cache.plugin = "paged";
  cache.params = {{"memory", "1GiB"}};
  cache.where = "benchmark";
  spec.components[ComponentKind::cache] = cache;
  ComponentSpec sched;
  sched.plugin = "continuous";
  sched.params = {{"max_batch_tokens", 16384}};
  sched.where = "benchmark";
  spec.components[ComponentKind::scheduler] = sched;
  return Pipeline::build(spec, registry());
}

std::vector<int32_t> prompt(int64_t n, int64_t vocab) {
  std::mt19937_64 rng(9);
  std::uniform_int_distribution<int32_t> tok(3, int32_t(vocab - 1));
  std::vector<int32_t> p(static_cast<size_t>(n));
  p[0] = 1;
  for (int64_t i = 1; i < n; ++i) p[size_t(i)] = tok(rng);
  return p;
}

// Arg 0: prompt tokens; arg 1: 0 gqa, 1 sparse. Time to first token of one request.
void BM_Prefill(benchmark::State& state) {
  auto p = long_pipeline(state.range(1) == 1);
  const auto tokens = prompt(state.range(0), p->model().config().vocab);
  for (auto _ : state) {
    Engine engine(*p);
    GenerationRequest req;
    req.prompt = tokens;
    req.max_tokens = 1;
    engine.submit(req);
    engine.run_until_idle();
    const auto r = engine.take_finished().at(0);
    state.SetIterationTime(r.first_token - r.admitted);
    state.counters["prefill_tok_per_s"] = double(tokens.size()) / (r.first_token - r.admitted);
  }
  state.SetLabel(std::string(state.range(1) == 1 ? "sparse keep 0.25" : "gqa") + ", " + p->model().config().name);
}
BENCHMARK(BM_Prefill)
    ->ArgsProduct({{512, 1024, 2048, 4096, 8192}, {0, 1}})
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// Arg 0: prompt tokens; arg 1: 0 gqa, 1 sparse. Decode tokens/s after the prompt.
void BM_Decode(benchmark::State& state) {
  auto p = long_pipeline(state.range(1) == 1);
  const auto tokens = prompt(state.range(0), p->model().config().vocab);
  constexpr int64_t kOut = 64;
  for (auto _ : state) {
    Engine engine(*p);
    GenerationRequest req;
    req.prompt = tokens;
    req.max_tokens = kOut;
    req.ignore_eos = true;
    engine.submit(req);
    engine.run_until_idle();
    const auto r = engine.take_finished().at(0);
    state.SetIterationTime(r.finished - r.first_token);
    state.counters["decode_tok_per_s"] = double(r.tokens.size() - 1) / (r.finished - r.first_token);
  }
  state.SetLabel(state.range(1) == 1 ? "sparse keep 0.25" : "gqa");
}
BENCHMARK(BM_Decode)->ArgsProduct({{4096}, {0, 1}})->Iterations(3)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace tessera

BENCHMARK_MAIN();
