// Engine benchmarks (Google Benchmark): whole engine runs on real pipelines, one iteration each,
// with the figures reported as counters. Models come from environment variables so that the
// synthetic presets (`tessera synth`) can be swapped in; scripts/bench_engine.sh sets them up.
//
//   TESSERA_BENCH_MODEL      model for decode concurrency        (default: stories260K f32)
//   TESSERA_BENCH_QUANTIZER  quantizer plugin for it              (default: none)
//   TESSERA_BENCH_LONG_MODEL model with >= 1024 context for TTFT (default: TESSERA_BENCH_MODEL)
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <random>

#include "tessera/engine.h"
#include "tessera/pipeline.h"
#include "bench_registry.h"
#include "tessera/registry.h"

namespace tessera {
namespace {

using bench::registry;

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : fallback;
}

std::string decode_model() {
  return env_or("TESSERA_BENCH_MODEL", TESSERA_SOURCE_DIR "/../shared/models/stories260K/stories260K-f32.gguf");
}

std::unique_ptr<Pipeline> pipeline(const std::string& model, const nlohmann::json& components) {
  PipelineSpec spec = default_pipeline_spec();
  spec.model = model;
  spec.backend = "cpu";
  for (const auto& [kind_text, value] : components.items()) {
    ComponentKind kind;
    parse_kind(kind_text, &kind);
    ComponentSpec c;
    c.plugin = value.at("plugin");
    c.params = value;
    c.params.erase("plugin");
    c.where = "benchmark";
    spec.components[kind] = c;
  }
  return Pipeline::build(spec, registry());
}

std::vector<int32_t> random_prompt(std::mt19937_64& rng, int64_t n, int64_t vocab) {
  std::uniform_int_distribution<int32_t> tok(3, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> p(static_cast<size_t>(n));
  p[0] = 1;
  for (int64_t i = 1; i < n; ++i) p[size_t(i)] = tok(rng);
  return p;
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * double(v.size() - 1) + 0.5));
  return v[i];
}

// Aggregate decode tokens/s with N sequences in flight: 128-token prompts, 64 output tokens each.
// Weights are read once per step for all sequences, so this should grow with N.
void BM_DecodeConcurrency(benchmark::State& state) {
  const int64_t n = state.range(0);
  auto p = pipeline(decode_model(), {{"quantizer", {{"plugin", env_or("TESSERA_BENCH_QUANTIZER", "none")}}},
                                     {"cache", {{"plugin", "paged"}, {"block_size", 16}, {"memory", "2GiB"}}},
                                     {"scheduler", {{"plugin", "continuous"}, {"max_seqs", 64}, {"max_batch_tokens", 8192}}}});
  std::mt19937_64 rng(7);
  for (auto _ : state) {
    Engine engine(*p);
    for (int64_t i = 0; i < n; ++i) {
      GenerationRequest req;
      req.prompt = random_prompt(rng, 128, p->model().config().vocab);
      req.max_tokens = 64;
      req.ignore_eos = true;
      engine.submit(req);
    }
    engine.run_until_idle();
    const auto results = engine.take_finished();
    double last_first = 0, end = 0;
    int64_t decoded = 0;
    for (const auto& r : results) {
      last_first = std::max(last_first, r.first_token);
      end = std::max(end, r.finished);
      decoded += int64_t(r.tokens.size()) - 1;
    }
    state.SetIterationTime(end - last_first);
    state.counters["decode_tok_per_s"] = double(decoded) / (end - last_first);
  }
  state.SetLabel(p->model().config().name + " " + p->model().weight_formats());
}
BENCHMARK(BM_DecodeConcurrency)->Arg(1)->Arg(4)->Arg(8)->Arg(16)->Arg(32)->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);

// Sequences in flight at a fixed KV budget on a mixed-length workload (prompts 16-256, outputs
// 16-256): paged allocates as sequences grow, contiguous reserves the maximum up front.
void BM_KvConcurrency(benchmark::State& state) {
  const bool paged = state.range(0) == 1;
  const std::string model = TESSERA_SOURCE_DIR "/../shared/models/stories260K/stories260K-f32.gguf";
  const nlohmann::json cache = paged ? nlohmann::json{{"plugin", "paged"}, {"block_size", 16}, {"memory", "2560KiB"}}
                                     : nlohmann::json{{"plugin", "contiguous"}, {"memory", "2560KiB"}};
  const double reserve = double(state.range(1)) / 100.0;
  auto p = pipeline(model, {{"cache", cache},
                            {"scheduler", {{"plugin", "continuous"}, {"max_seqs", 256}, {"max_batch_tokens", 4096},
                                           {"admission_reserve", reserve}}}});
  std::mt19937_64 rng(11);
  std::uniform_int_distribution<int64_t> len(16, 256);
  for (auto _ : state) {
    Engine engine(*p);
    for (int i = 0; i < 64; ++i) {
      GenerationRequest req;
      req.prompt = random_prompt(rng, len(rng), 512);
      req.max_tokens = len(rng);
      req.ignore_eos = true;
      engine.submit(req);
    }
    const auto t0 = engine.now();
    engine.run_until_idle();
    state.SetIterationTime(engine.now() - t0);
    state.counters["peak_running"] = double(engine.stats().peak_running);
    state.counters["preemptions"] = double(engine.stats().preemptions);
  }
  state.SetLabel(std::string(paged ? "paged" : "contiguous") + ", KV budget 2560KiB = 2048 tokens, admission_reserve " +
                 std::to_string(reserve).substr(0, 4));
}
BENCHMARK(BM_KvConcurrency)
    ->Args({0, 0})
    ->Args({1, 0})
    ->Args({1, 50})
    ->Args({1, 100})
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// P99 TTFT of short requests when 20% of requests ask for 512 output tokens: one queue against a
// `long` queue with its own cap. Requests arrive at a steady rate (Poisson, seeded); short ones
// want 32 tokens.
void BM_ShortTtft(benchmark::State& state) {
  const bool queues = state.range(0) == 1;
  const double rate = double(state.range(1));  // requests per second
  nlohmann::json sched = {{"plugin", "continuous"}, {"max_seqs", 4}, {"max_batch_tokens", 512}};
  if (queues) sched["queues"] = {{{"name", "long"}, {"min_expected_output", 200}, {"max_running", 1}}};
  auto p = pipeline(env_or("TESSERA_BENCH_LONG_MODEL", decode_model()),
                    {{"cache", {{"plugin", "paged"}, {"memory", "1GiB"}}}, {"scheduler", sched}});
  std::mt19937_64 rng(5);
  std::exponential_distribution<double> gap(rate);
  constexpr int kRequests = 100;
  for (auto _ : state) {
    Engine engine(*p);
    std::vector<double> arrivals;
    double t = 0;
    for (int i = 0; i < kRequests; ++i) arrivals.push_back(t += gap(rng));
    std::vector<bool> is_long;
    const double t0 = engine.now();
    size_t next = 0;
    while (next < arrivals.size() || engine.step()) {
      while (next < arrivals.size() && engine.now() - t0 >= arrivals[next]) {
        GenerationRequest req;
        req.prompt = random_prompt(rng, 64, p->model().config().vocab);
        const bool long_one = next % 5 == 0;  // 20%
        req.max_tokens = long_one ? 512 : 32;
        req.ignore_eos = true;
        is_long.push_back(long_one);
        engine.submit(req);
        ++next;
      }
      if (next < arrivals.size()) engine.step();
    }
    const double wall = engine.now() - t0;
    std::vector<double> ttft;
    int64_t tokens = 0;
    for (const auto& r : engine.take_finished()) {
      tokens += int64_t(r.tokens.size());
      if (!is_long[size_t(r.id - 1)]) ttft.push_back(r.ttft());
    }
    state.SetIterationTime(wall);
    state.counters["short_p99_ttft_ms"] = percentile(ttft, 0.99) * 1000;
    state.counters["short_p50_ttft_ms"] = percentile(ttft, 0.50) * 1000;
    state.counters["tok_per_s"] = double(tokens) / wall;
  }
  state.SetLabel(std::string(queues ? "long queue (>=200 expected, max_running 2)" : "single queue") + ", " +
                 std::to_string(kRequests) + " requests at " + std::to_string(int(rate)) + "/s, max_seqs 4, " +
                 p->model().config().name);
}
BENCHMARK(BM_ShortTtft)->Args({0, 60})->Args({1, 60})->Args({0, 100})->Args({1, 100})->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);

// TTFT of chat-like turns that repeat a long prefix (a system prompt or document): each request is
// the same prefix plus 16 new tokens, sent after the previous one finished, with paged (recomputes
// the prefix every time) against prefix_lru (maps the cached prefix). The first request of each run
// finds nothing cached; the counters cover the other 7.
void BM_SharedPrefixTtft(benchmark::State& state) {
  const bool reuse = state.range(0) == 1;
  const nlohmann::json cache = {{"plugin", reuse ? "prefix_lru" : "paged"}, {"block_size", 16}, {"memory", "1GiB"}};
  auto p = pipeline(env_or("TESSERA_BENCH_LONG_MODEL", decode_model()),
                    {{"cache", cache}, {"scheduler", {{"plugin", "continuous"}, {"max_seqs", 8}, {"max_batch_tokens", 2048}}}});
  const int64_t vocab = p->model().config().vocab;
  const int64_t prefix_len = std::min<int64_t>(1024, p->model().config().context_length - 48);
  constexpr int kTurns = 8;
  std::mt19937_64 rng(3);
  const auto prefix = random_prompt(rng, prefix_len, vocab);
  for (auto _ : state) {
    Engine engine(*p);
    std::vector<double> ttft;
    int64_t prefill_before = 0;
    const double t0 = engine.now();
    for (int i = 0; i < kTurns; ++i) {
      GenerationRequest req;
      req.prompt = prefix;
      const auto turn = random_prompt(rng, 17, vocab);
      req.prompt.insert(req.prompt.end(), turn.begin() + 1, turn.end());
      req.max_tokens = 16;
      req.ignore_eos = true;
      engine.submit(req);
      engine.run_until_idle();
      const auto done = engine.take_finished();
      if (i == 0) {
        prefill_before = engine.stats().prefill_tokens;
      } else {
        ttft.push_back(done.at(0).ttft());
      }
    }
    state.SetIterationTime(engine.now() - t0);
    double mean = 0;
    for (double t : ttft) mean += t;
    state.counters["mean_ttft_ms"] = mean / double(ttft.size()) * 1000;
    state.counters["prefill_tokens_per_turn"] =
        double(engine.stats().prefill_tokens - prefill_before) / double(kTurns - 1);
    state.counters["prefix_hit_rate"] = p->cache().stats().prefix.hit_rate();
  }
  state.SetLabel(std::string(reuse ? "prefix_lru" : "paged") + ", prefix " + std::to_string(prefix_len) +
                 " + 16 tokens per turn, 16 out, turns one after another, " + p->model().config().name);
}
BENCHMARK(BM_SharedPrefixTtft)->Arg(0)->Arg(1)->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace tessera

BENCHMARK_MAIN();
