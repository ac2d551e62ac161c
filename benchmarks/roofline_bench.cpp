// Single-stream decode as a share of this machine's read-bandwidth roofline (issue #3): weight bytes
// per token x decode tokens/s over the measured read bandwidth. On a shared machine the bandwidth
// moves by a third within minutes, so a probe run minutes before a decode says little about it
// (scripts/roofline.sh, which alternates processes, sees that spread). Here the probe and the
// decode alternate in one process: every decode run sits between two probe windows of ~0.15 s,
// its share is over their mean, and the counters give the median share over the runs and the
// range (share_with_kv_median: the same with the K/V bytes attention reads added to the weights'),
// and how far apart the host placed the threads (report_placements).
// The same pipeline files as `tessera run -p` (pipelines/*.yaml), on the synthetic 110m.
// BM_PrefillRoofline does the same for prefill against the FMA peak; BM_DecodeVs sets two pipelines'
// decodes side by side.
//
//   TESSERA_ROOFLINE_MODEL  GGUF for the float and int pipelines (default: `tessera synth --preset
//                           110m`, written to $TMPDIR once). The gguf pipelines read the synthetic
//                           110m written as Q8_0, Q4_0 or another GGUF type (also in $TMPDIR,
//                           once).
//   OMP_NUM_THREADS         decode and probe threads (default: all cores)
//   TESSERA_VS_A, _B        BM_DecodeVs's pipeline files
//
// args: pipeline (0 baseline f32, 1 int8, 2 int4, 3 gguf Q8_0, 4 gguf Q4_0, 5-14 gguf Q4_1, Q5_0,
// Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS), decode runs.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench_registry.h"
#include "tessera/engine.h"
#include "tessera/host_arena.h"
#include "tessera/machine_probe.h"
#include "tessera/pipeline.h"
#include "tessera/synth.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kDecodeTokens = 128;
constexpr double kProbeSeconds = 0.15;
constexpr size_t kProbeBytes = size_t(256) << 20;

struct RooflineCase {
  const char* pipeline;  // under pipelines/
  DType weights;         // of the model file it reads
};
constexpr RooflineCase kCases[] = {
    {"baseline.yaml", DType::F32}, {"int8.yaml", DType::F32}, {"int4.yaml", DType::F32},
    {"gguf.yaml", DType::Q8_0},    {"gguf.yaml", DType::Q4_0},
    // The other GGUF types (indices 5-19), each the synthetic 110m written whole in that type.
    {"gguf.yaml", DType::Q4_1},    {"gguf.yaml", DType::Q5_0},   {"gguf.yaml", DType::Q5_1},
    {"gguf.yaml", DType::Q2_K},    {"gguf.yaml", DType::Q3_K},   {"gguf.yaml", DType::Q4_K},
    {"gguf.yaml", DType::Q5_K},    {"gguf.yaml", DType::Q6_K},   {"gguf.yaml", DType::IQ4_NL},
    {"gguf.yaml", DType::IQ4_XS},
    // The codebook types (indices 15-19): their files take minutes to write the first time.
    {"gguf.yaml", DType::IQ2_XXS},   {"gguf.yaml", DType::IQ2_XS}, {"gguf.yaml", DType::IQ2_S},
    {"gguf.yaml", DType::IQ3_XXS},   {"gguf.yaml", DType::IQ3_S},
};

std::string model_for(DType weights) {
  const char* env = std::getenv("TESSERA_ROOFLINE_MODEL");
  if (weights == DType::F32 && env != nullptr && *env != '\0') return env;
  // The f32 file is the one scripts/roofline.sh writes.
  const std::string suffix = weights == DType::F32 ? "" : "-" + std::string(dtype_name(weights));
  const fs::path path = fs::temp_directory_path() / ("tessera-roofline-110m" + suffix + ".gguf");
  if (!fs::exists(path)) {
    SynthSpec spec = synth_preset("110m");
    spec.dtype = weights;
    const fs::path part = path.string() + ".part";  // a run stopped mid-write leaves no model behind
    write_synthetic_model(spec, part.string());
    fs::rename(part, path);
  }
  return path.string();
}

// The read rate over whole passes of the probe buffer lasting at least kProbeSeconds, passes
// cycling through the probe's read patterns (kProbePatterns): the fastest pattern's mean.
double probe_window(const float* buf) {
  double seconds[kProbePatternCount] = {};
  int passes[kProbePatternCount] = {};
  double total = 0;
  for (int i = 0; total < kProbeSeconds || passes[kProbePatternCount - 1] == 0; i = (i + 1) % kProbePatternCount) {
    const auto t0 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(read_bandwidth_pass(buf, kProbeBytes / 4, i));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    seconds[i] += s;
    total += s;
    ++passes[i];
  }
  double best = 0;
  for (int i = 0; i < kProbePatternCount; ++i) best = std::max(best, passes[i] / seconds[i]);
  return double(kProbeBytes) * best / 1e9;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 != 0 ? v[h] : (v[h - 1] + v[h]) / 2;
}

// The pipeline file on the CPU backend, reading the synthetic 110m stored as `weights`.
std::unique_ptr<Pipeline> pipeline_from(const std::string& path, DType weights) {
  PipelineSpec spec = load_pipeline_spec(path);
  spec.model = model_for(weights);
  spec.backend = "cpu";
  return Pipeline::build(spec, bench::registry());
}

std::unique_ptr<Pipeline> pipeline_for(const RooflineCase& c) {
  return pipeline_from(TESSERA_SOURCE_DIR "/pipelines/" + std::string(c.pipeline), c.weights);
}

void report_shares(benchmark::State& state, const std::vector<double>& shares) {
  state.counters["share_median"] = median(shares);
  state.counters["share_min"] = *std::min_element(shares.begin(), shares.end());
  state.counters["share_max"] = *std::max_element(shares.begin(), shares.end());
}

// The host's placement of the threads, per run: a cache line's round trip between the team's two
// threads (measure_core_round_trip, which says what it tells apart). Reported: the round trips'
// range, and where the runs saw both placements (the slowest round trip over twice the fastest),
// the medians of `values` over the runs below and above their geometric mean, as
// <name>_near_cores and <name>_far_cores.
void report_placements(benchmark::State& state, const std::string& name, const std::vector<double>& values,
                       const std::vector<double>& trips) {
  const auto [fastest, slowest] = std::minmax_element(trips.begin(), trips.end());
  state.counters["core_round_trip_ns_min"] = *fastest;
  state.counters["core_round_trip_ns_max"] = *slowest;
  if (*fastest <= 0 || *slowest < 2 * *fastest) return;
  const double split = std::sqrt(*fastest * *slowest);
  std::vector<double> near, far;
  for (size_t i = 0; i < values.size(); ++i) (trips[i] < split ? near : far).push_back(values[i]);
  state.counters[name + "_near_cores"] = median(near);
  state.counters[name + "_far_cores"] = median(far);
  state.counters["runs_far_cores"] = double(far.size());
}

// One decode of kDecodeTokens after a random kPromptTokens-token prompt: its tokens/s.
constexpr int64_t kPromptTokens = 7;
double decode_tokens_per_s(Pipeline& pipeline, std::mt19937_64& rng) {
  std::uniform_int_distribution<int32_t> token(3, int32_t(pipeline.model().config().vocab - 1));
  Engine engine(pipeline);
  GenerationRequest req;
  req.prompt = {1};
  for (int i = 1; i < kPromptTokens; ++i) req.prompt.push_back(token(rng));
  req.max_tokens = kDecodeTokens;
  req.ignore_eos = true;
  engine.submit(req);
  engine.run_until_idle();
  const GenerationResult r = engine.take_finished().at(0);
  return double(r.tokens.size() - 1) / (r.finished - r.first_token);
}

// The K and V bytes a decode step's attention reads, on average over a run's steps (the prompt's
// keys, then one more each step). The roofline's bytes are the weights alone; these are read from
// memory too (5% more bytes for the 110m's f32 cache here, and a tenth of the step's time), so
// share_with_kv counts them.
double kv_bytes_per_token(Pipeline& p, int64_t prompt_tokens) {
  const ModelConfig& mc = p.model().config();
  const double token_bytes =
      double(mc.n_layers) * 2 * double(dtype_row_bytes(p.spec().kv_dtype, mc.n_kv_heads * mc.head_dim));
  return token_bytes * (double(prompt_tokens) + double(kDecodeTokens) / 2);
}

void BM_DecodeRoofline(benchmark::State& state) {
  const RooflineCase& c = kCases[size_t(state.range(0))];
  const int64_t runs = state.range(1);
  auto pipeline = pipeline_for(c);
  const double bytes_per_token = double(pipeline->model().decode_bytes_per_token());
  const double kv_bytes = kv_bytes_per_token(*pipeline, kPromptTokens);

  auto unmap = [](float* p) { unmap_huge_pages(p, kProbeBytes); };
  std::unique_ptr<float, decltype(unmap)> probe_buf(static_cast<float*>(map_huge_pages(kProbeBytes)), unmap);
  if (!probe_buf) {
    state.SkipWithError("cannot map 256 MiB for the bandwidth probe");
    return;
  }
  std::fill(probe_buf.get(), probe_buf.get() + kProbeBytes / 4, 1.0f);

  std::mt19937_64 rng(3);
  std::vector<double> shares, with_kv, rates, probes, trips, read_rates;
  for (auto _ : state) {
    double before = probe_window(probe_buf.get());
    for (int64_t run = 0; run < runs; ++run) {
      const double tok_per_s = decode_tokens_per_s(*pipeline, rng);
      const double after = probe_window(probe_buf.get());
      trips.push_back(measure_core_round_trip(1000).value);
      const double probe = (before + after) / 2;
      rates.push_back(tok_per_s);
      read_rates.push_back(bytes_per_token * tok_per_s / 1e9);
      probes.push_back(probe);
      shares.push_back(bytes_per_token * tok_per_s / 1e9 / probe);
      with_kv.push_back((bytes_per_token + kv_bytes) * tok_per_s / 1e9 / probe);
      before = after;
    }
  }
  report_shares(state, shares);
  report_placements(state, "share_median", shares, trips);
  state.counters["share_with_kv_median"] = median(with_kv);
  state.counters["kv_MB_per_token"] = kv_bytes / 1e6;
  state.counters["decode_tok_per_s"] = median(rates);
  state.counters["probe_GB_per_s"] = median(probes);
  state.counters["decode_GB_per_s"] = median(read_rates);  // weight bytes a token x tokens/s
  state.counters["weight_MB_per_token"] = bytes_per_token / 1e6;
  state.SetLabel(std::string(c.pipeline) + ": " + pipeline->describe() + ", " + pipeline->model().weight_formats() + ", " +
                 std::to_string(omp_get_max_threads()) + " threads, " + std::to_string(kDecodeTokens) + " tokens a run");
}
BENCHMARK(BM_DecodeRoofline)
    ->ArgsProduct({{0, 1, 2, 3, 4}, {12}})
    ->ArgsProduct({benchmark::CreateDenseRange(5, 19, 1), {6}})  // every other GGUF type, side by side
    ->Iterations(1)
    ->Unit(benchmark::kSecond);

// Two pipelines' decodes side by side (TESSERA_VS_A, TESSERA_VS_B: pipeline files, by default
// pipelines/int8.yaml and pipelines/int4.yaml), their runs alternated A B B A A B ... in one process,
// so that each pair sees the same moments of the host: per pair, B's tokens/s over A's and B's weight
// read rate (bytes a token x tokens/s) over A's, medians over the pairs (and apart by placement, as
// BM_DecodeRoofline). Two separate runs of a pipeline differ by up to a third here from minute to
// minute; these ratios, by ~1%. args: pairs.
void BM_DecodeVs(benchmark::State& state) {
  const char* names[2] = {std::getenv("TESSERA_VS_A"), std::getenv("TESSERA_VS_B")};
  const std::string paths[2] = {names[0] != nullptr ? names[0] : TESSERA_SOURCE_DIR "/pipelines/int8.yaml",
                                names[1] != nullptr ? names[1] : TESSERA_SOURCE_DIR "/pipelines/int4.yaml"};
  std::unique_ptr<Pipeline> pipelines[2];
  double bytes[2];
  for (int i = 0; i < 2; ++i) {
    pipelines[i] = pipeline_from(paths[i], DType::F32);
    bytes[i] = double(pipelines[i]->model().decode_bytes_per_token());
  }
  std::mt19937_64 rng(3);
  std::vector<double> tok_ratios, read_ratios, trips;
  for (auto _ : state) {
    double rate[2] = {0, 0};
    for (int64_t run = 0; run < 2 * state.range(0); ++run) {
      const int which = int((run + run / 2) % 2);  // A B B A: a drift favours neither
      rate[which] = decode_tokens_per_s(*pipelines[which], rng);
      if (run % 2 == 1) {
        tok_ratios.push_back(rate[1] / rate[0]);
        read_ratios.push_back(bytes[1] * rate[1] / (bytes[0] * rate[0]));
        trips.push_back(measure_core_round_trip(1000).value);
      }
    }
  }
  state.counters["b_over_a_tok_per_s"] = median(tok_ratios);
  state.counters["b_over_a_read_rate"] = median(read_ratios);
  state.counters["pairs"] = double(tok_ratios.size());
  report_placements(state, "b_over_a_tok_per_s", tok_ratios, trips);
  state.SetLabel("a " + paths[0] + " (" + pipelines[0]->model().weight_formats() + "), b " + paths[1] + " (" +
                 pipelines[1]->model().weight_formats() + "), " + std::to_string(omp_get_max_threads()) + " threads, " +
                 std::to_string(kDecodeTokens) + " tokens a run");
}
BENCHMARK(BM_DecodeVs)->Arg(16)->Iterations(1)->Unit(benchmark::kSecond);

// Each architecture's decode against llama's on the same 110m shape (f32 weights, the baseline
// pipeline; synthetic models written to $TMPDIR once), alternated A B B A as BM_DecodeVs: the
// per-pair ratio of tokens/s and of weight read rate (bytes a token x tokens/s), medians. What an
// architecture adds (biases, q/k norms, post-norms, GeGLU, soft caps, windows) should cost little
// against the weights it streams. args: architecture (index into synth_architectures()), pairs.
void BM_ArchDecodeVsLlama(benchmark::State& state) {
  const std::string arch = synth_architectures().at(size_t(state.range(0)));
  std::unique_ptr<Pipeline> pipelines[2];
  double bytes[2];
  for (int i = 0; i < 2; ++i) {
    const std::string name = i == 0 ? "llama" : arch;
    const fs::path path = fs::temp_directory_path() / ("tessera-arch-110m-" + name + ".gguf");
    if (!fs::exists(path)) {
      SynthSpec spec = synth_preset("110m");
      spec.arch = name;
      const fs::path part = path.string() + ".part";
      write_synthetic_model(spec, part.string());
      fs::rename(part, path);
    }
    PipelineSpec spec = load_pipeline_spec(TESSERA_SOURCE_DIR "/pipelines/baseline.yaml");
    spec.model = path.string();
    spec.backend = "cpu";
    pipelines[i] = Pipeline::build(spec, bench::registry());
    bytes[i] = double(pipelines[i]->model().decode_bytes_per_token());
  }
  std::mt19937_64 rng(5);
  std::vector<double> tok_ratios, read_ratios;
  for (auto _ : state) {
    double rate[2] = {0, 0};
    for (int64_t run = 0; run < 2 * state.range(1); ++run) {
      const int which = int((run + run / 2) % 2);
      rate[which] = decode_tokens_per_s(*pipelines[which], rng);
      if (run % 2 == 1) {
        tok_ratios.push_back(rate[1] / rate[0]);
        read_ratios.push_back(bytes[1] * rate[1] / (bytes[0] * rate[0]));
      }
    }
  }
  state.counters["arch_over_llama_tok_per_s"] = median(tok_ratios);
  state.counters["arch_over_llama_read_rate"] = median(read_ratios);
  state.counters["pairs"] = double(tok_ratios.size());
  state.SetLabel(arch + " vs llama, 110m f32, " + std::to_string(omp_get_max_threads()) + " threads, " +
                 std::to_string(kDecodeTokens) + " tokens a run");
}
BENCHMARK(BM_ArchDecodeVsLlama)->ArgsProduct({{1, 2, 3, 4, 5, 6, 7}, {6}})->Iterations(1)->Unit(benchmark::kSecond);

// Prefill of a 128-token prompt as a share of the FMA peak (issue #3): twice the multiply-adds of
// the layers for every prompt token and of the head for the last, over the prefill time (admitted
// to first token, as `tessera run` reports it), over the mean of FMA probes just before and after.
// A process's first prefill pays one-time costs (starting the thread team, waking an idle vCPU,
// first touch of the KV pages it writes: ~10-15 ms of ~100 on the 2-vCPU VMs here): its share is
// reported apart (share_first) and the median is over the runs after it, as a warm-up is left out.
// args: pipeline (as BM_DecodeRoofline), prefill runs after the first.
void BM_PrefillRoofline(benchmark::State& state) {
  constexpr int64_t kPromptTokens = 128;
  const RooflineCase& c = kCases[size_t(state.range(0))];
  const int64_t runs = state.range(1);
  auto pipeline = pipeline_for(c);
  const Model& model = pipeline->model();
  const double gflop = 2.0 * double(model.layer_macs_per_token() * kPromptTokens + model.head_macs()) / 1e9;

  std::mt19937_64 rng(5);
  std::uniform_int_distribution<int32_t> token(3, int32_t(model.config().vocab - 1));
  std::vector<double> shares, rates, probes;
  double first = 0;
  for (auto _ : state) {
    double before = measure_fma_peak(kProbeSeconds).value;
    for (int64_t run = 0; run <= runs; ++run) {
      Engine engine(*pipeline);
      GenerationRequest req;
      req.prompt = {1};
      while (int64_t(req.prompt.size()) < kPromptTokens) req.prompt.push_back(token(rng));
      req.max_tokens = 1;
      engine.submit(req);
      engine.run_until_idle();
      const GenerationResult r = engine.take_finished().at(0);
      const double rate = gflop / (r.first_token - r.admitted);
      const double after = measure_fma_peak(kProbeSeconds).value;
      const double share = rate / ((before + after) / 2);
      before = after;
      if (run == 0) {
        first = share;
        continue;
      }
      rates.push_back(rate);
      probes.push_back(after);
      shares.push_back(share);
    }
  }
  report_shares(state, shares);
  state.counters["share_first"] = first;
  state.counters["prefill_GFLOP_per_s"] = median(rates);
  state.counters["fma_peak_GFLOP_per_s"] = median(probes);
  state.SetLabel(std::string(c.pipeline) + ": " + pipeline->describe() + ", " + model.weight_formats() + ", " +
                 std::to_string(omp_get_max_threads()) + " threads, " + std::to_string(kPromptTokens) +
                 "-token prompt");
}
BENCHMARK(BM_PrefillRoofline)->ArgsProduct({{0, 1, 2, 3, 4}, {8}})->Iterations(1)->Unit(benchmark::kSecond);

}  // namespace
}  // namespace tessera

BENCHMARK_MAIN();
