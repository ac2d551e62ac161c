// Every architecture against an independent reference: a NumPy forward pass written from llama.cpp's
// and the models' published semantics (tests/reference/, float64), on synthetic models of each
// architecture (random weights, norms and biases, so that a block part skipped or misread changes
// the logits). For each: the log-probabilities Tessera reports for its top tokens at every step of a
// greedy generation (prefill and the decode path) agree with the reference's log-softmax, and the
// greedy tokens agree while the reference's top-2 margin is clear.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>

#include "test_util.h"
#include "tessera/decoder.h"
#include "tessera/engine.h"
#include "tessera/synth.h"
#include "tessera/thread_team.h"

namespace tessera {
namespace {

struct ArchCase {
  std::string label;
  SynthSpec spec;
};

SynthSpec tiny(const std::string& arch) {
  SynthSpec s = synth_preset("tiny");
  s.arch = arch;
  s.n_layers = 2;
  s.seed = 7;
  return s;
}

std::vector<ArchCase> arch_cases() {
  std::vector<ArchCase> out;
  for (const std::string& arch : synth_architectures()) out.push_back({arch, tiny(arch)});
  // Head sizes of their own (Qwen3, Gemma: key_length != dim / heads).
  out[3].spec.head_dim = 32;                                      // qwen3
  for (size_t i = 5; i < 8; ++i) out[i].spec.head_dim = 32;       // gemma, gemma2, gemma3
  out[2].spec.n_kv_heads = 1;                                     // qwen2: MQA
  out[1].spec.sliding_window = 6;                                 // mistral: every layer slides
  out[6].spec.sliding_window = 5;                                 // gemma2: even layers slide
  out[7].spec.sliding_window = 5;                                 // gemma3: five local, one global
  out[7].spec.n_layers = 7;
  out[7].spec.rope_theta = 1e6;
  for (const char* scaling : {"linear", "yarn", "freqs"}) {
    ArchCase c{std::string("llama_rope_") + scaling, tiny("llama")};
    c.spec.rope_scaling = scaling;
    out.push_back(c);
  }
  ArchCase g3{"gemma3_rope_linear", out[7].spec};
  g3.spec.rope_scaling = "linear";
  out.push_back(g3);
  // Weights large enough that a decode step on two threads runs each layer in one parallel region
  // (Model::decode_in_few_regions): biases, post-norms, GeGLU and fused tensors on that path too.
  for (size_t i : {2, 4, 6, 7}) {
    ArchCase wide{out[i].label + "_wide", out[i].spec};
    wide.spec.dim = 256;
    wide.spec.ffn_dim = 512;
    wide.spec.head_dim = out[i].spec.head_dim > 0 ? 64 : 0;
    out.push_back(wide);
  }
  return out;
}

class ArchReference : public testing::TestWithParam<ArchCase> {};

// The reference's JSON for `tokens`: logits of every position.
nlohmann::json reference(const std::string& model, const std::vector<int32_t>& tokens) {
  std::string ids;
  for (int32_t t : tokens) ids += (ids.empty() ? "" : ",") + std::to_string(t);
  const std::string cmd = "/usr/bin/python3 " TESSERA_SOURCE_DIR "/tests/reference/gguf_reference.py '" + model +
                          "' --all --json --tokens " + ids + " 2>&1";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  std::string out;
  char buf[65536];
  for (size_t n; (n = fread(buf, 1, sizeof buf, pipe.get())) > 0;) out.append(buf, n);
  try {
    return nlohmann::json::parse(out);
  } catch (const std::exception&) {
    ADD_FAILURE() << "the reference failed: " << cmd << "\n" << out.substr(0, 2000);
    return {};
  }
}

std::vector<double> log_softmax(const nlohmann::json& logits) {
  std::vector<double> v = logits.get<std::vector<double>>();
  double m = -INFINITY, sum = 0;
  for (double x : v) m = std::max(m, x);
  for (double x : v) sum += std::exp(x - m);
  for (double& x : v) x = x - m - std::log(sum);
  return v;
}

TEST_P(ArchReference, LogprobsAndGreedyTokensMatchTheNumPyReference) {
  if (std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "/usr/bin/python3 with NumPy (Debian's python3-numpy) is needed for the reference";
  }
  const ArchCase& c = GetParam();
  const test::TempDir dir;
  const std::string model = dir.path() + "/" + c.label + ".gguf";
  write_synthetic_model(c.spec, model);

  // A prompt longer than the windows, so that sliding layers drop keys.
  std::vector<int32_t> prompt = {1};
  for (int i = 0; i < 13; ++i) prompt.push_back(3 + (i * 37 + 11) % 500);
  const int64_t steps = 6;
  auto pipeline = test::cpu_pipeline(model);
  EXPECT_EQ(pipeline->model().config().architecture, c.spec.arch);
  if (c.label.ends_with("_wide") && team_max_threads() >= 2) {
    EXPECT_TRUE(pipeline->model().decodes_in_layer_regions()) << "the one-region-per-layer decode is not reached";
  }
  Engine engine(*pipeline);
  GenerationRequest req;
  req.prompt = prompt;
  req.max_tokens = steps;
  req.ignore_eos = true;
  SamplingParams sp;
  sp.temperature = 0;
  sp.logprobs = 5;
  req.sampling = sp;
  engine.submit(std::move(req));
  engine.run_until_idle();
  auto results = engine.take_finished();
  ASSERT_EQ(results.size(), 1u);
  const GenerationResult& r = results[0];
  ASSERT_EQ(r.tokens.size(), size_t(steps));
  ASSERT_EQ(r.top_logprobs.size(), size_t(steps));

  std::vector<int32_t> all = prompt;
  all.insert(all.end(), r.tokens.begin(), r.tokens.end());
  const nlohmann::json ref = reference(model, all);
  ASSERT_TRUE(ref.contains("logits")) << ref.dump().substr(0, 500);
  ASSERT_EQ(ref.at("logits").size(), all.size());
  double max_diff = 0;
  bool greedy_clear = true;
  for (int64_t i = 0; i < steps; ++i) {
    const auto lp = log_softmax(ref.at("logits")[prompt.size() - 1 + size_t(i)]);
    for (const TokenLogprob& t : r.top_logprobs[size_t(i)]) {
      max_diff = std::max(max_diff, std::abs(double(t.logprob) - lp[size_t(t.token)]));
    }
    // The reference's greedy choice, while its margin over the runner-up is clear of float error.
    std::vector<double> sorted = lp;
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
    const auto best = int32_t(std::max_element(lp.begin(), lp.end()) - lp.begin());
    greedy_clear = greedy_clear && sorted[0] - sorted[1] > 1e-3;
    if (greedy_clear) EXPECT_EQ(r.tokens[size_t(i)], best) << "step " << i;
  }
  std::printf("[ %s ] max |logprob - reference| over %lld steps x top 5: %.3g\n", c.label.c_str(),
              static_cast<long long>(steps), max_diff);
  EXPECT_LT(max_diff, 2e-3) << c.label;
}

INSTANTIATE_TEST_SUITE_P(Architectures, ArchReference, testing::ValuesIn(arch_cases()),
                         [](const testing::TestParamInfo<ArchCase>& info) { return info.param.label; });

}  // namespace
}  // namespace tessera
