// `tessera serve` on every architecture: a greedy completion over HTTP gives the tokens `tessera run`
// gives for the same prompt (synthetic models from `tessera synth --arch`), and /v1/models answers.
#include <gtest/gtest.h>

#include "serve_test_util.h"
#include "tessera/synth.h"

namespace tessera {
namespace {

using nlohmann::json;
using test::ServerProcess;

class ServeArch : public testing::TestWithParam<std::string> {};

TEST_P(ServeArch, GreedyCompletionsMatchTesseraRun) {
  const std::string& arch = GetParam();
  test::TempDir dir;
  const std::string model = dir.path() + "/" + arch + ".gguf";
  const std::string head = arch == "qwen3" || arch.rfind("gemma", 0) == 0 ? " --head-dim 32" : "";
  ASSERT_EQ(test::tessera_cmd("synth --preset tiny --arch " + arch + head + " -o '" + model + "'").status, 0);
  const test::Output run = test::tessera_cmd("run --format json -n 8 -m '" + model + "' 'Once upon a time'");
  ASSERT_EQ(run.status, 0) << run.text;
  const json want = json::parse(run.text.substr(run.text.find('{')));

  ServerProcess server({"-p", test::serve_pipeline(dir), "-m", model});
  httplib::Client c = server.client();
  auto res = c.Post("/v1/completions",
                    json{{"prompt", "Once upon a time"}, {"max_tokens", 8}, {"temperature", 0}, {"ignore_eos", true},
                         {"logprobs", 1}}
                        .dump(),
                    "application/json");
  ASSERT_TRUE(res) << httplib::to_string(res.error()) << "\n" << server.log();
  ASSERT_EQ(res->status, 200) << res->body;
  const json got = json::parse(res->body);
  EXPECT_EQ(got["choices"][0]["text"], want["completion_text"]) << res->body;
  EXPECT_EQ(got["usage"]["completion_tokens"], 8);
  auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 200);
}

INSTANTIATE_TEST_SUITE_P(Architectures, ServeArch, testing::ValuesIn(synth_architectures()),
                         [](const testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace tessera
