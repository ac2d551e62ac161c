// Structured-output costs, per vocabulary: the time to compile each JSON Schema of a folder
// (../shared/schemas) and the time to compute one token mask while generating under it. Each
// schema is walked twice with the same seed (a random allowed token per step, as a model that knows
// nothing would pick): the first walk is a cold request (every new grammar state walks the
// vocabulary trie), the second a repeated one (the same schema again: states found in the cache).
// Prints median and P99 per vocabulary with the conditions. Not a timed test: a report.
//
//   constraint_bench [--schemas DIR] [--steps N] [--plugin-dir DIR] [--verbose] VOCAB.gguf...
//   (default vocabularies: ../shared/vocab/ggml-vocab-{llama-spm,gpt-2,deepseek-llm}.gguf)
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

}  // namespace

int main(int argc, char** argv) {
  std::string schemas = std::string(TESSERA_SHARED_DIR) + "/schemas";
  std::string plugin_dir;
  int steps = 256;
  bool verbose = false;
  std::vector<std::string> vocabs;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--schemas" && i + 1 < argc) schemas = argv[++i];
    else if (a == "--steps" && i + 1 < argc) steps = std::stoi(argv[++i]);
    else if (a == "--plugin-dir" && i + 1 < argc) plugin_dir = argv[++i];
    else if (a == "--verbose") verbose = true;
    else vocabs.push_back(a);
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
