// Engine benchmarks (Google Benchmark): whole engine runs on real pipelines, one iteration each,
// with the figures reported as counters. Models come from environment variables so that the
// synthetic presets (`tessera synth`) can be swapped in; scripts/bench_engine.sh sets them up.
//
//   TESSERA_BENCH_MODEL      model for decode concurrency        (default: stories260K f32)
//   TESSERA_BENCH_QUANTIZER  quantizer plugin for it              (default: none)
//   TESSERA_BENCH_LONG_MODEL model with >= 1024 context for TTFT (default: TESSERA_BENCH_MODEL)
//   TESSERA_BENCH_BACKEND    backend of every pipeline             (default: cpu; cuda, hip)
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>

#include "tessera/engine.h"
#include "tessera/pipeline.h"
#include "bench_registry.h"
#include "tessera/error.h"
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
  spec.backend = env_or("TESSERA_BENCH_BACKEND", "cpu");
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

// Speculative against plain greedy decoding, one request at a time (where speculation pays most):
// the five golden prompts, 96 tokens each. Arg: 0 plain, 1 ngram, 2 layer_skip, 3 draft_model
// (the Q8_0 file as the draft of the f32 target), 4 self_quantized (int4). Window 4.
void BM_Speculative(benchmark::State& state) {
  const std::string dir = TESSERA_SOURCE_DIR "/../shared/models/stories260K/";
  static const char* kNames[] = {"plain", "ngram", "layer_skip", "draft_model", "self_quantized"};
  const std::string name = kNames[state.range(0)];
  nlohmann::json decoder = {{"plugin", "speculative"}, {"proposer", name}, {"window", 4}};
  if (name == "plain") decoder = {{"plugin", "sampling"}};
  if (name == "layer_skip") decoder["layers"] = 2;
  if (name == "draft_model") decoder["draft_model"] = dir + "stories260K-q8_0.gguf";
  if (name == "self_quantized") decoder["draft_quantizer"] = "int4";
  auto p = pipeline(dir + "stories260K-f32.gguf",
                    {{"cache", {{"plugin", "paged"}, {"block_size", 16}, {"memory", "64MiB"}}},
                     {"scheduler", {{"plugin", "continuous"}, {"max_seqs", 8}}},
                     {"decoder", decoder}});
  const std::vector<std::string> prompts = {"Once upon a time", "Tom and his dog went to the park", "Lily and Ben",
                                            "The little bird", "One day, a big"};
  for (auto _ : state) {
    double seconds = 0;
    int64_t decoded = 0;
    SpeculationStats spec;
    for (int repeat = 0; repeat < 4; ++repeat) {
      for (const auto& text : prompts) {
        Engine engine(*p);
        GenerationRequest req;
        req.prompt = p->tokenizer().encode(text, true);
        req.max_tokens = 96;
        req.ignore_eos = true;
        engine.submit(req);
        engine.run_until_idle();
        const auto r = engine.take_finished().at(0);
        seconds += r.finished - r.first_token;
        decoded += int64_t(r.tokens.size()) - 1;
        const SpeculationStats s = engine.stats().speculation;
        spec.proposed += s.proposed;
        spec.accepted += s.accepted;
        spec.verifications += s.verifications;
        spec.draft_seconds += s.draft_seconds;
        spec.step_seconds += s.step_seconds;
      }
    }
    state.SetIterationTime(seconds);
    state.counters["decode_tok_per_s"] = double(decoded) / seconds;
    state.counters["acceptance"] = spec.acceptance_rate();
    state.counters["mean_accepted"] = spec.mean_accepted_length();
    state.counters["draft_share"] = spec.draft_time_share();
  }
  state.SetLabel(name + ", stories260K f32, greedy, 1 request at a time, 20 x 96 tokens, window 4");
}
BENCHMARK(BM_Speculative)->DenseRange(0, 4)->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);

// The golden prompts (/work/shared/golden/stories260K-f32.greedy96.json) with their plain greedy
// continuations: the speculative runs below must reproduce them token for token.
struct GoldenCase {
  std::vector<int32_t> prompt, completion;
};

const std::vector<GoldenCase>& golden_cases() {
  static const std::vector<GoldenCase> cases = [] {
    std::ifstream in(TESSERA_SOURCE_DIR "/../shared/golden/stories260K-f32.greedy96.json");
    if (!in) throw Error("golden file stories260K-f32.greedy96.json not found under shared/golden");
    std::vector<GoldenCase> out;
    for (const auto& g : nlohmann::json::parse(in)) {
      out.push_back({g.at("prompt_token_ids").get<std::vector<int32_t>>(),
                     g.at("completion_token_ids").get<std::vector<int32_t>>()});
    }
    return out;
  }();
  return cases;
}

// One pass over the golden prompts, one request at a time, greedy: decode time (first token to
// last), decoded tokens, speculation counters, and whether every output equals the golden one.
struct GoldenPass {
  double seconds = 0;
  int64_t decoded = 0;
  SpeculationStats spec;
  bool identical = true;
  double tok_per_s() const { return double(decoded) / seconds; }
};

GoldenPass golden_pass(Pipeline& p) {
  GoldenPass pass;
  for (const GoldenCase& g : golden_cases()) {
    Engine engine(p);
    GenerationRequest req;
    req.prompt = g.prompt;
    req.max_tokens = int64_t(g.completion.size());
    req.ignore_eos = true;
    engine.submit(req);
    engine.run_until_idle();
    const auto r = engine.take_finished().at(0);
    pass.seconds += r.finished - r.first_token;
    pass.decoded += int64_t(r.tokens.size()) - 1;
    pass.identical = pass.identical && r.tokens == g.completion;
    const SpeculationStats s = engine.stats().speculation;
    pass.spec.proposed += s.proposed;
    pass.spec.accepted += s.accepted;
    pass.spec.verifications += s.verifications;
    pass.spec.draft_seconds += s.draft_seconds;
    pass.spec.step_seconds += s.step_seconds;
  }
  return pass;
}

std::unique_ptr<Pipeline> golden_pipeline(const nlohmann::json& decoder) {
  return pipeline(TESSERA_SOURCE_DIR "/../shared/models/stories260K/stories260K-f32.gguf",
                  {{"cache", {{"plugin", "paged"}, {"block_size", 16}, {"memory", "64MiB"}}},
                   {"scheduler", {{"plugin", "continuous"}, {"max_seqs", 8}}},
                   {"decoder", decoder}});
}

// The sweep's drafts: a label and the decoder settings behind it.
struct SweepDraft {
  const char* label;
  nlohmann::json decoder;
};

SweepDraft sweep_draft(int64_t index) {
  const std::string dir = TESSERA_SOURCE_DIR "/../shared/models/stories260K/";
  const std::string q8 = dir + "stories260K-q8_0.gguf";
  auto spec = [](const char* proposer, nlohmann::json extra = nlohmann::json::object()) {
    extra.update({{"plugin", "speculative"}, {"proposer", proposer}});
    return extra;
  };
  switch (index) {
    case 0: return {"ngram", spec("ngram")};
    case 1: return {"layer_skip (2 of 5 layers)", spec("layer_skip", {{"layers", 2}})};
    case 2: return {"draft_model (Q8_0 file, dequantized like the target)", spec("draft_model", {{"draft_model", q8}})};
    case 3: return {"self_quantized int4", spec("self_quantized", {{"draft_quantizer", "int4"}})};
    case 4: return {"draft_model (Q8_0 file, gguf blocks)",
                    spec("draft_model", {{"draft_model", q8}, {"draft_quantizer", "gguf"}})};
    default: return {"self_quantized int8", spec("self_quantized", {{"draft_quantizer", "int8"}})};
  }
}

// Plain and speculative passes alternate `repeats` times and each keeps its fastest pass, so that
// both see the same (shared, noisy) machine.
std::pair<GoldenPass, GoldenPass> best_of(Pipeline& plain, Pipeline& spec, int repeats) {
  GoldenPass best_plain, best_spec;
  best_plain.seconds = best_spec.seconds = 1e30;
  for (int i = 0; i < repeats; ++i) {
    GoldenPass a = golden_pass(plain);
    GoldenPass b = golden_pass(spec);
    b.identical = b.identical && a.identical;
    if (a.seconds < best_plain.seconds) best_plain = a;
    if (b.seconds < best_spec.seconds || !b.identical) best_spec = b;
    if (!b.identical) break;
  }
  return {best_plain, best_spec};
}

// The draft-length curve: window k = 1..10 (fixed, not adaptive) per proposer on the golden prompts,
// against plain greedy decoding measured in the same run; prints one row per k and the best point.
// Arg: see sweep_draft.
void BM_SpeculativeSweep(benchmark::State& state) {
  const SweepDraft draft = sweep_draft(state.range(0));
  const std::string name = draft.label;
  const auto plain = golden_pipeline({{"plugin", "sampling"}});
  constexpr int kRepeats = 3;
  for (auto _ : state) {
    std::printf("\n%s: stories260K f32 target on %s, greedy, golden prompts x 96 tokens, 1 request at a time, "
                "best of %d\n",
                name.c_str(), env_or("TESSERA_BENCH_BACKEND", "cpu").c_str(), kRepeats);
    std::printf("%3s %12s %12s %8s %10s %13s %11s %9s\n", "k", "plain tok/s", "spec tok/s", "speedup", "acceptance",
                "mean accepted", "draft share", "identical");
    double best_speedup = 0, total = 0;
    int64_t best_k = 0;
    bool identical = true;
    for (int64_t k = 1; k <= 10; ++k) {
      nlohmann::json d = draft.decoder;
      d["window"] = k;
      const auto spec = golden_pipeline(d);
      const auto [a, b] = best_of(*plain, *spec, kRepeats);
      const double speedup = b.tok_per_s() / a.tok_per_s();
      total += a.seconds + b.seconds;
      identical = identical && b.identical;
      std::printf("%3lld %12.0f %12.0f %7.2fx %10.3f %13.2f %11.2f %9s\n", (long long)k, a.tok_per_s(), b.tok_per_s(),
                  speedup, b.spec.acceptance_rate(), b.spec.mean_accepted_length(), b.spec.draft_time_share(),
                  b.identical ? "yes" : "NO");
      if (speedup > best_speedup) best_speedup = speedup, best_k = k;
    }
    std::printf("best: k=%lld, %.2fx\n", (long long)best_k, best_speedup);
    std::fflush(stdout);
    if (!identical) state.SkipWithError("speculative output differs from plain greedy decoding");
    state.SetIterationTime(total);
    state.counters["best_k"] = double(best_k);
    state.counters["best_speedup"] = best_speedup;
  }
  state.SetLabel(name + ", k = 1..10");
}
BENCHMARK(BM_SpeculativeSweep)->DenseRange(0, 5)->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);

// A deliberately bad draft: layer_skip with 1 of the 5 layers (its drafts almost never match), with
// a fixed window against the adaptive window, each against plain decoding in the same run.
// Arg: 0 fixed window 4, 1 adaptive (window 4 at the start).
void BM_SpeculativeBadDraft(benchmark::State& state) {
  const bool adaptive = state.range(0) == 1;
  const auto plain = golden_pipeline({{"plugin", "sampling"}});
  const auto spec = golden_pipeline({{"plugin", "speculative"}, {"proposer", "layer_skip"}, {"layers", 1},
                                     {"window", 4}, {"adaptive", adaptive}});
  // Plain and speculative passes alternate; the median of the per-round ratios is robust to a
  // neighbour's load burst hitting one pass.
  constexpr int kRounds = 15;
  for (auto _ : state) {
    std::vector<double> ratios;
    GoldenPass a, b;
    double seconds = 0;
    bool identical = true;
    for (int i = 0; i < kRounds; ++i) {
      a = golden_pass(*plain);
      b = golden_pass(*spec);
      identical = identical && a.identical && b.identical;
      ratios.push_back(b.tok_per_s() / a.tok_per_s());
      seconds += b.seconds;
    }
    if (!identical) state.SkipWithError("speculative output differs from plain greedy decoding");
    state.SetIterationTime(seconds / kRounds);
    state.counters["slowdown_pct_median"] = (1 - percentile(ratios, 0.5)) * 100;
    state.counters["slowdown_pct_p25"] = (1 - percentile(ratios, 0.75)) * 100;
    state.counters["slowdown_pct_p75"] = (1 - percentile(ratios, 0.25)) * 100;
    state.counters["acceptance"] = b.spec.acceptance_rate();
    state.counters["verifications"] = double(b.spec.verifications);
    state.counters["proposed"] = double(b.spec.proposed);
  }
  state.SetLabel(std::string("layer_skip 1 of 5 layers, ") + (adaptive ? "adaptive" : "fixed") +
                 " window 4, golden prompts, median of 15 alternating rounds");
}
BENCHMARK(BM_SpeculativeBadDraft)->Arg(0)->Arg(1)->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);

// Cost of one target forward with T = 1..11 tokens (a k+1-token verification for k = T-1) at
// position 100 of one sequence, logits for every row, relative to T = 1: the price of checking k
// drafts, which the accepted length has to beat. Model::forward only (no engine, no decoder).
// TESSERA_BENCH_VERIFY_MODEL swaps the model (e.g. `tessera synth --preset 110m`), to show where
// the weights no longer fit in cache and a forward's cost stops growing with T.
void BM_VerifyForward(benchmark::State& state) {
  const std::string model =
      env_or("TESSERA_BENCH_VERIFY_MODEL", TESSERA_SOURCE_DIR "/../shared/models/stories260K/stories260K-f32.gguf");
  const auto p = pipeline(model, {{"cache", {{"plugin", "paged"}, {"block_size", 16}, {"memory", "256MiB"}}}});
  const int64_t vocab = p->model().config().vocab;
  std::mt19937_64 rng(9);
  const auto tokens = random_prompt(rng, 112, vocab);
  CacheRequest req{1, int64_t(tokens.size()), tokens, "default", false};
  auto plan = p->cache().plan(std::span<const CacheRequest>(&req, 1));
  if (!plan) throw Error("BM_VerifyForward: no cache room");
  p->cache().commit(*plan);
  std::vector<float> logits;
  ForwardSeq prefill{1, std::span<const int32_t>(tokens).first(100), 0, 1};
  p->model().forward(std::span<const ForwardSeq>(&prefill, 1), p->attention(), p->cache(), logits);
  p->cache().mark_computed(1, 100);
  auto forward = [&](int64_t t) {
    ForwardSeq fs{1, std::span<const int32_t>(tokens).subspan(100, size_t(t)), 100, t};
    p->model().forward(std::span<const ForwardSeq>(&fs, 1), p->attention(), p->cache(), logits);
  };
  // Repetitions for ~50 ms a round; the fastest of 5 rounds counts (the machine is shared).
  const auto t0 = std::chrono::steady_clock::now();
  forward(1);
  const double probe = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int reps = std::max(3, int(0.05 / std::max(probe, 1e-6)));
  auto time_t = [&](int64_t t) {
    double best = 1e30;
    for (int round = 0; round < 5; ++round) {
      const auto a = std::chrono::steady_clock::now();
      for (int i = 0; i < reps; ++i) forward(t);
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count() / reps);
    }
    return best;
  };
  for (auto _ : state) {
    const double one = time_t(1);
    std::printf("\nModel::forward at position 100, %s, best of 5 x %d\n%3s %10s %9s\n",
                p->model().config().name.c_str(), reps, "T", "us", "vs T=1");
    double total = one;
    for (int64_t t = 1; t <= 11; ++t) {
      const double s = t == 1 ? one : time_t(t);
      total += s;
      std::printf("%3lld %10.1f %8.2fx\n", (long long)t, s * 1e6, s / one);
      if (t == 5) state.counters["t5_vs_t1"] = s / one;
    }
    std::fflush(stdout);
    state.SetIterationTime(total);
    state.counters["t1_us"] = one * 1e6;
  }
  state.SetLabel(p->model().config().name + " " + p->model().weight_formats());
}
BENCHMARK(BM_VerifyForward)->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);

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
