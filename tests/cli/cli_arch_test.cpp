// Every architecture through the commands a user runs: `tessera run` (naming the architecture and
// tokenizer), `eval` (a finite perplexity) and `bench` (a report for the model), on synthetic models
// written by `tessera synth --arch`, one of them with a real byte-level BPE vocabulary.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "test_util.h"
#include "tessera/synth.h"

namespace tessera {
namespace {

using test::Output;
using test::tessera_cmd;

struct ArchModel {
  std::string arch;
  std::string extra;  // synth flags beyond --arch
};

std::vector<ArchModel> arch_models() {
  std::vector<ArchModel> out;
  for (const std::string& a : synth_architectures()) {
    out.push_back({a, a == "qwen3" || a.rfind("gemma", 0) == 0 ? "--head-dim 32" : ""});
  }
  return out;
}

class CliArch : public testing::TestWithParam<ArchModel> {};

TEST_P(CliArch, RunEvalAndBenchWork) {
  const ArchModel& m = GetParam();
  test::TempDir dir;
  const std::string model = dir.path() + "/" + m.arch + ".gguf";
  const Output synth = tessera_cmd("synth --preset tiny --arch " + m.arch + " " + m.extra + " -o '" + model + "'");
  ASSERT_EQ(synth.status, 0) << synth.text;

  const Output run = tessera_cmd("run --format json -n 6 -m '" + model + "' 'Once upon a time'");
  ASSERT_EQ(run.status, 0) << run.text;
  const auto j = nlohmann::json::parse(run.text.substr(run.text.find('{')));
  EXPECT_EQ(j.at("architecture"), m.arch);
  EXPECT_EQ(j.at("tokenizer"), "llama");
  EXPECT_EQ(j.at("completion_token_ids").size(), 6u);

  const Output eval = tessera_cmd("eval --format json --ctx 32 -m '" + model + "' --text '" + test::kShared +
                                  "/eval/tiny_stories_eval.txt'");
  ASSERT_EQ(eval.status, 0) << eval.text;
  const double ppl = nlohmann::json::parse(eval.text.substr(eval.text.find('{'))).at("perplexity").get<double>();
  EXPECT_TRUE(std::isfinite(ppl) && ppl > 1) << ppl;

  const std::string workload = dir.write("tiny.yaml", test::kTinyBenchWorkload);
  const Output bench = tessera_cmd("bench -q --no-accuracy --probe-seconds 0.02 --pipelines pipelines/baseline.yaml -m '" +
                                   model + "' --workload '" + workload + "' --out '" + dir.path() + "/out'");
  ASSERT_EQ(bench.status, 0) << bench.text;
  std::ifstream report(dir.path() + "/out/report.json");
  ASSERT_TRUE(report.good());
  EXPECT_NE(nlohmann::json::parse(report).dump().find(m.arch), std::string::npos) << "the report names no model";
}

INSTANTIATE_TEST_SUITE_P(Architectures, CliArch, testing::ValuesIn(arch_models()),
                         [](const testing::TestParamInfo<ArchModel>& info) { return info.param.arch; });

TEST(CliArch, AByteLevelBpeVocabularyRunsEndToEnd) {
  // qwen2 with GPT-2's real vocabulary: text in, BPE ids to the model, text out.
  test::TempDir dir;
  const std::string model = dir.path() + "/qwen2-gpt2.gguf";
  const Output synth = tessera_cmd("synth --preset tiny --arch qwen2 --vocab-file '" + test::kShared +
                                   "/vocab/ggml-vocab-gpt-2.gguf' -o '" + model + "'");
  ASSERT_EQ(synth.status, 0) << synth.text;
  const Output run = tessera_cmd("run --format json -n 4 -m '" + model + "' 'Hello world'");
  ASSERT_EQ(run.status, 0) << run.text;
  const auto j = nlohmann::json::parse(run.text.substr(run.text.find('{')));
  EXPECT_EQ(j.at("tokenizer"), "gpt2");
  // GPT-2's own ids for "Hello world" (no BOS: its vocabulary adds none).
  EXPECT_EQ(j.at("prompt_token_ids"), nlohmann::json::array({15496, 995}));
  const Output tok = tessera_cmd("tokenize --format json -m '" + model + "' 'Hello world'");
  ASSERT_EQ(tok.status, 0) << tok.text;
  EXPECT_EQ(nlohmann::json::parse(tok.text).at("ids"), nlohmann::json::array({15496, 995}));
}

}  // namespace
}  // namespace tessera
