// Tokenizer throughput (Google Benchmark): encode and decode of ~64 KB of English and of CJK text
// with every vocabulary in ../shared/vocab (SentencePiece and byte-level BPE), as bytes/s
// ("bytes_per_second"), plus bytes per token. The text is a paragraph repeated, the same every run.
// TESSERA_VOCAB_DIR picks another folder of vocabulary GGUF files.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "tessera/gguf.h"
#include "tessera/tokenizer.h"

namespace tessera {
namespace {

constexpr size_t kTextBytes = 64 * 1024;

const char* const kEnglish =
    "The committee met on Tuesday, March 4th, to review the 2023 budget: revenue rose 7.5% to $12.3 million, "
    "while costs (mostly salaries and rent) grew faster than expected. \"We can't keep spending like this,\" "
    "said the treasurer, who'd warned about it before. Members asked whether the new office - opened in "
    "September - was worth its 1,200 square feet; others weren't so sure.\n\n"
    "    def total(items):\n        return sum(item.price * item.count for item in items)  # dollars\n";

// Chinese, Japanese and Korean prose with full-width punctuation and a few digits.
const char* const kCjk =
    "\xe4\xbb\x8a\xe5\xa4\xa9\xe7\x9a\x84\xe4\xbc\x9a\xe8\xae\xae\xe8\xae\xa8\xe8\xae\xba\xe4\xba\x86\xe6\x98\x8e"
    "\xe5\xb9\xb4\xe7\x9a\x84\xe9\xa2\x84\xe7\xae\x97\xef\xbc\x8c\xe6\x94\xb6\xe5\x85\xa5\xe5\xa2\x9e\xe9\x95\xbf"
    "\xe4\xba\x86\x37\x2e\x35\x25\xef\xbc\x8c\xe4\xbd\x86\xe6\x98\xaf\xe6\x88\x90\xe6\x9c\xac\xe4\xb9\x9f\xe5\x9c"
    "\xa8\xe5\xa2\x9e\xe5\x8a\xa0\xe3\x80\x82\xe5\xa4\xa7\xe5\xae\xb6\xe8\xae\xa4\xe4\xb8\xba\xe6\x96\xb0\xe5\x8a"
    "\x9e\xe5\x85\xac\xe5\xae\xa4\xe5\xbe\x88\xe6\xbc\x82\xe4\xba\xae\xef\xbc\x8c\xe5\x8f\xaf\xe6\x98\xaf\xe7\xa7"
    "\x9f\xe9\x87\x91\xe5\xa4\xaa\xe8\xb4\xb5\xe4\xba\x86\xe3\x80\x82\n"
    "\xe4\xbb\x8a\xe6\x97\xa5\xe3\x81\xaf\xe9\x9b\xa8\xe3\x81\x8c\xe9\x99\x8d\xe3\x81\xa3\xe3\x81\xa6\xe3\x81\x84"
    "\xe3\x81\xbe\xe3\x81\x99\xe3\x81\x8c\xe3\x80\x81\xe4\xbc\x9a\xe8\xad\xb0\xe3\x81\xaf\xe4\xba\x88\xe5\xae\x9a"
    "\xe9\x80\x9a\xe3\x82\x8a\xe5\x8d\x88\xe5\xbe\x8c\x33\xe6\x99\x82\xe3\x81\xab\xe5\xa7\x8b\xe3\x81\xbe\xe3\x82"
    "\x8a\xe3\x81\xbe\xe3\x81\x99\xe3\x80\x82\n"
    "\xec\x98\xa4\xeb\x8a\x98\xec\x9d\x80\x20\xeb\xb9\x84\xea\xb0\x80\x20\xec\x98\xa4\xec\xa7\x80\xeb\xa7\x8c\x20"
    "\xed\x9a\x8c\xec\x9d\x98\xeb\x8a\x94\x20\xec\x98\x88\xec\xa0\x95\xeb\x8c\x80\xeb\xa1\x9c\x20\xec\x97\xb4\xeb"
    "\xa6\xbd\xeb\x8b\x88\xeb\x8b\xa4\x2e\n";

std::string repeat_to_size(const std::string& paragraph) {
  std::string text;
  while (text.size() < kTextBytes) text += paragraph;
  return text;
}

std::string vocab_dir() {
  if (const char* env = std::getenv("TESSERA_VOCAB_DIR"); env != nullptr && *env != '\0') return env;
  return TESSERA_SHARED_DIR "/vocab";
}

void encode_bench(benchmark::State& state, std::shared_ptr<const Tokenizer> tok, std::string text) {
  size_t tokens = 0;
  for (auto _ : state) {
    const std::vector<int32_t> ids = tok->encode(text, false);
    tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["bytes_per_token"] = static_cast<double>(text.size()) / static_cast<double>(std::max<size_t>(tokens, 1));
}

void decode_bench(benchmark::State& state, std::shared_ptr<const Tokenizer> tok, std::string text) {
  const std::vector<int32_t> ids = tok->encode(text, false);
  for (auto _ : state) {
    const std::string out = tok->decode(ids);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  using namespace tessera;
  benchmark::Initialize(&argc, argv);
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(vocab_dir(), ec)) {
    if (e.path().extension() == ".gguf") files.push_back(e.path());
  }
  if (files.empty()) {
    std::fprintf(stderr, "tokenizer_bench: no .gguf files in %s (set TESSERA_VOCAB_DIR)\n", vocab_dir().c_str());
    return 1;
  }
  std::sort(files.begin(), files.end());
  const std::string english = repeat_to_size(kEnglish), cjk = repeat_to_size(kCjk);
  for (const auto& path : files) {
    std::shared_ptr<const Tokenizer> tok = Tokenizer::create(load_vocabulary(*GgufFile::open(path.string())));
    std::string name = path.stem().string();
    if (name.rfind("ggml-vocab-", 0) == 0) name = name.substr(11);
    benchmark::RegisterBenchmark(("BM_Encode/" + name + "/english").c_str(), encode_bench, tok, english);
    benchmark::RegisterBenchmark(("BM_Encode/" + name + "/cjk").c_str(), encode_bench, tok, cjk);
    benchmark::RegisterBenchmark(("BM_Decode/" + name + "/english").c_str(), decode_bench, tok, english);
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
