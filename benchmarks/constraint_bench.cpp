// Structured-output costs, per vocabulary: the time to compile each JSON Schema of a folder
// (../shared/schemas) and the time to compute one token mask while generating under it. Each
// schema is walked twice with the same seed (a random allowed token per step, as a model that knows
// nothing would pick): the first walk is a cold request (every new grammar state walks the
// vocabulary trie), the second a repeated one (the same schema again: states found in the cache).
// Prints median and P99 per vocabulary with the conditions. Not a timed test: a report.
//
//   constraint_bench [--schemas DIR] [--steps N] [--plugin-dir DIR] [--verbose] VOCAB.gguf...
//   (default vocabularies: ../shared/vocab/ggml-vocab-{llama-spm,gpt-2,deepseek-llm}.gguf)
//
// With --model M.gguf it measures instead what a constraint costs a real decode: greedy generation
// of --steps tokens under a JSON Schema (a free-text field, then a field of fixed length whose every
// position is a new grammar state) against the same generation unconstrained (ignore_eos), each
// pair alternated --pairs times in one process; decode tokens/s and the ratio (median of pairs).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tessera/constraint.h"
#include "tessera/engine.h"
#include "tessera/pipeline.h"
#include "tessera/error.h"
#include "tessera/gguf.h"
#include "tessera/registry.h"
#include "tessera/tokenizer.h"

namespace fs = std::filesystem;
using namespace tessera;

namespace {

using Clock = std::chrono::steady_clock;

double us_since(Clock::time_point t) { return std::chrono::duration<double, std::micro>(Clock::now() - t).count(); }

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(q * double(v.size())))];
}

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Walks a compiled schema with random allowed tokens; appends each mask's time.
void walk(const CompiledConstraint& c, int64_t vocab, uint64_t seed, int steps, std::vector<double>& times) {
  auto s = c.start();
  std::vector<uint32_t> mask(mask_words(vocab));
  std::mt19937_64 rng(seed);
  std::vector<int32_t> ok;
  for (int i = 0; i < steps && !s->finished(); ++i) {
    const auto t = Clock::now();
    s->fill_mask(mask, steps - i);
    times.push_back(us_since(t));
    ok.clear();
    for (int32_t tok = 0; tok < vocab; ++tok)
      if (mask_has(mask, tok)) ok.push_back(tok);
    if (ok.empty()) break;
    const int32_t pick = ok[rng() % ok.size()];
    if (!s->accept(pick)) throw Error("a masked token was refused");
  }
}

// Decode tokens/s of one greedy generation (after its first token); adds the engine's mask time
// and constrained tokens to `mask`.
struct MaskTime {
  double seconds = 0;
  int64_t tokens = 0;
};
double decode_rate(Pipeline& p, const std::vector<int32_t>& prompt, int steps,
                   std::shared_ptr<const CompiledConstraint> constraint, MaskTime* mask = nullptr) {
  Engine engine(p);
  GenerationRequest req;
  req.prompt = prompt;
  req.max_tokens = steps;
  req.sampling = SamplingParams{};
  req.ignore_eos = true;
  req.constraint = std::move(constraint);
  engine.submit(req);
  engine.run_until_idle();
  const GenerationResult r = engine.take_finished().at(0);
  if (mask != nullptr) {
    mask->seconds += engine.stats().mask_seconds;
    mask->tokens += engine.stats().constrained_tokens;
  }
  if (r.tokens.size() < 2) throw Error("generated " + std::to_string(r.tokens.size()) + " tokens: " + r.error);
  return double(r.tokens.size() - 1) / (r.finished - r.first_token);
}

int model_overhead(const std::string& model, int steps, int pairs, int threads) {
  Registry registry;
  registry.load_default_paths();
  PipelineSpec spec = default_pipeline_spec();
  spec.model = model;
  PipelineOptions options;
  options.threads = threads;
  auto p = Pipeline::build(spec, registry, options);
  const std::vector<int32_t> prompt = p->tokenizer().encode("Write the story as JSON:", true);
  const std::string n = std::to_string(steps);
  const std::vector<std::pair<std::string, std::string>> schemas = {
      {"free string", R"({"type":"object","properties":{"story":{"type":"string"}},"required":["story"]})"},
      {"string of " + n + " chars",
       R"({"type":"object","properties":{"story":{"type":"string","minLength":)" + n + R"(,"maxLength":)" + n + "}},\"required\":[\"story\"]}"}};
  std::printf("constraint_bench: %s, %s, %d tokens greedy, %d pairs alternated, %d threads\n", model.c_str(),
              p->describe().c_str(), steps, pairs, threads);
  std::printf("%-26s %14s %14s %8s %14s %10s\n", "schema", "plain tok/s", "schema tok/s", "ratio", "mask us/token",
              "tokens");
  for (const auto& [name, schema] : schemas) {
    const auto c = p->constraint().compile({"json_schema", schema, name});
    std::vector<double> plain, constrained, ratio;
    MaskTime mask;
    for (int i = 0; i < pairs; ++i) {
      plain.push_back(decode_rate(*p, prompt, steps, nullptr));
      constrained.push_back(decode_rate(*p, prompt, steps, c, &mask));
      ratio.push_back(constrained.back() / plain.back());
    }
    std::printf("%-26s %14.2f %14.2f %8.3f %14.1f %10.1f\n", name.c_str(), quantile(plain, 0.5),
                quantile(constrained, 0.5), quantile(ratio, 0.5), 1e6 * mask.seconds / double(std::max<int64_t>(1, mask.tokens)),
                double(mask.tokens) / pairs);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string schemas = std::string(TESSERA_SHARED_DIR) + "/schemas";
  std::string plugin_dir;
  int steps = 256;
  bool verbose = false;
  std::string model;
  int pairs = 3, threads = 0;
  std::vector<std::string> vocabs;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--schemas" && i + 1 < argc) schemas = argv[++i];
    else if (a == "--steps" && i + 1 < argc) steps = std::stoi(argv[++i]);
    else if (a == "--plugin-dir" && i + 1 < argc) plugin_dir = argv[++i];
    else if (a == "--verbose") verbose = true;
    else if (a == "--model" && i + 1 < argc) model = argv[++i];
    else if (a == "--pairs" && i + 1 < argc) pairs = std::stoi(argv[++i]);
    else if (a == "--threads" && i + 1 < argc) threads = std::stoi(argv[++i]);
    else vocabs.push_back(a);
  }
  if (!model.empty()) {
    try {
      return model_overhead(model, steps, pairs, threads);
    } catch (const std::exception& e) {
      std::cerr << "error: " << e.what() << "\n";
      return 1;
    }
  }
  if (vocabs.empty())
    for (const char* v : {"llama-spm", "gpt-2", "deepseek-llm"})
      vocabs.push_back(std::string(TESSERA_SHARED_DIR) + "/vocab/ggml-vocab-" + v + ".gguf");
  try {
    Registry registry;
    if (plugin_dir.empty()) registry.load_default_paths();
    else registry.load_directory(plugin_dir);
    std::vector<std::string> files;
    for (const auto& e : fs::directory_iterator(schemas))
      if (e.path().extension() == ".json") files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
    std::printf("constraint_bench: plugin 'grammar', %zu schemas from %s, random walks of up to %d tokens, one thread\n",
                files.size(), schemas.c_str(), steps);
    std::printf("%-28s %7s %9s | %11s %11s | %11s %11s | %11s %11s\n", "vocabulary", "tokens", "compiled",
                "compile p50", "compile p99", "cold p50", "cold p99", "warm p50", "warm p99");
    for (const std::string& path : vocabs) {
      const auto tokenizer = Tokenizer::create(load_vocabulary(*GgufFile::open(path)));
      const int64_t n = tokenizer->vocab_size();
      std::vector<double> compile, cold, warm;
      size_t compiled = 0, failed = 0;
      for (const std::string& f : files) {
        // A fresh component per schema: nothing cached from the one before.
        auto constraint = registry.create<Constraint>("grammar", nlohmann::json::object(), "constraint_bench");
        constraint->set_vocabulary(constraint_vocab(*tokenizer));
        const std::string text = read(f);
        std::shared_ptr<const CompiledConstraint> c;
        const auto t = Clock::now();
        try {
          c = constraint->compile({"json_schema", text, f});
        } catch (const Error&) {
          continue;
        }
        compile.push_back(us_since(t));
        ++compiled;
        const size_t before = cold.size();
        const auto w = Clock::now();
        try {
          walk(*c, n, 1, steps, cold);
          walk(*c, n, 1, steps, warm);
        } catch (const Error& e) {
          std::printf("  %s: walk failed: %s\n", f.c_str(), e.what());
          ++failed;
        }
        if (verbose)
          std::printf("  %-60s compile %8.0fus, %4zu steps, walks %8.0fus\n", fs::path(f).filename().c_str(),
                      compile.back(), cold.size() - before, us_since(w));
      }
      std::printf("%-28s %7lld %4zu/%-4zu | %9.0fus %9.0fus | %9.1fus %9.0fus | %9.1fus %9.1fus\n",
                  fs::path(path).stem().string().c_str(), static_cast<long long>(n), compiled, files.size(),
                  quantile(compile, 0.5), quantile(compile, 0.99), quantile(cold, 0.5), quantile(cold, 0.99),
                  quantile(warm, 0.5), quantile(warm, 0.99));
      if (failed > 0) std::printf("  %zu walks failed\n", failed);
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
