// Structured output through the engine: every real-world schema of ../shared/schemas either compiles
// or is refused with a message, and every output generated under one parses and validates
// (python3-jsonschema is the oracle), with models that know nothing of JSON (stories260K; a
// synthetic model on the real 32,000-token llama vocabulary), greedy and sampled. Also: choices and
// grammars are followed exactly, a short max_tokens still ends in a parsable output, and speculative
// decoding keeps the constraint and greedy's tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tessera/engine.h"
#include "tessera/synth.h"
#include "test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using namespace test;

bool python_has_jsonschema() {
  return std::system("/usr/bin/python3 -c 'import jsonschema' >/dev/null 2>&1") == 0;
}

std::vector<std::string> schema_files() {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(kShared + "/schemas"))
    if (e.path().extension() == ".json") out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

struct Sampling {
  double temperature;
  uint64_t seed;
};

// Generates under every schema the constraint compiles (all settings in one batch per schema),
// checks each request ended on its own (not cut by max_tokens, no error), validates all outputs
// with the oracle, and returns how many schemas compiled.
size_t generate_and_validate(Pipeline& p, const std::vector<Sampling>& settings, const std::string& label) {
  const TempDir dir;
  nlohmann::json cases = nlohmann::json::array();
  std::vector<std::string> refused;
  size_t compiled = 0, too_long = 0;
  const std::vector<int32_t> prompt = p.tokenizer().encode("Once upon a time, the answer was", true);
  for (const std::string& path : schema_files()) {
    std::shared_ptr<const CompiledConstraint> c;
    try {
      c = p.constraint().compile({"json_schema", read_text(path), path});
    } catch (const Error& e) {
      refused.push_back(e.what());
      // A refusal names what it does not support, and where.
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      continue;
    }
    ++compiled;
    Engine engine(p);
    for (const Sampling& s : settings) {
      GenerationRequest req;
      req.prompt = prompt;
      req.max_tokens = p.max_sequence_tokens() - int64_t(prompt.size());
      req.sampling = SamplingParams{};
      req.sampling->temperature = s.temperature;
      req.sampling->seed = s.seed;
      req.constraint = c;
      engine.submit(req);
    }
    engine.run_until_idle();
    for (const GenerationResult& r : engine.take_finished()) {
      if (r.reason == FinishReason::length && c->min_output_bytes() > int64_t(r.tokens.size())) {
        // The schema's shortest output is longer in bytes than the model's context in tokens, and
        // this vocabulary could not fit it in: nothing to validate.
        ++too_long;
        continue;
      }
      EXPECT_TRUE(r.reason == FinishReason::eos || r.reason == FinishReason::stop)
          << path << ": finished by " << finish_reason_name(r.reason) << " " << r.error << " after " << r.tokens.size()
          << " tokens: " << r.text.substr(0, 200);
      cases.push_back({{"schema", path}, {"output", r.text}, {"label", label + " request " + std::to_string(r.id)}});
    }
  }
  std::cout << label << ": " << compiled << " of " << schema_files().size() << " schemas compiled; " << too_long
            << " outputs cut by the context before the schema's shortest output length; refused:\n";
  EXPECT_LE(too_long, 6u);
  for (const std::string& r : refused) std::cout << "  " << r.substr(0, 200) << "\n";
  const std::string file = dir.path() + "/outputs.json";
  std::ofstream(file) << cases.dump();
  const Output v = [&] {
    Output o;
    FILE* pipe = popen(("/usr/bin/python3 '" TESSERA_SOURCE_DIR "/tests/reference/validate_json_outputs.py' '" + file +
                        "' 2>&1").c_str(), "r");
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) o.text.append(buf, n);
    o.status = pclose(pipe);
    return o;
  }();
  std::cout << label << ": " << v.text.substr(v.text.rfind("valid ")) ;
  EXPECT_EQ(v.status, 0) << v.text;
  return compiled;
}

class ConstrainedGeneration : public testing::Test {
 protected:
  void SetUp() override {
    if (!python_has_jsonschema())
      GTEST_SKIP() << "/usr/bin/python3 has no jsonschema module (Debian: python3-jsonschema; scripts/setup.sh installs it)";
  }
};

// Coverage floor: the schemas compiled today; a regression in the converter fails here.
constexpr size_t kMinCompiled = 90;

TEST_F(ConstrainedGeneration, RealSchemasWithStories260KGreedyAndSampled) {
  auto p = cpu_pipeline(kStoriesF32);
  EXPECT_GE(generate_and_validate(*p, {{0.0, 0}, {1.0, 1}}, "stories260K"), kMinCompiled);
}

TEST_F(ConstrainedGeneration, RealSchemasWithTheLlamaVocabulary) {
  const TempDir dir;
  SynthSpec spec = synth_preset("tiny");
  spec.vocab_file = kShared + "/vocab/ggml-vocab-llama-spm.gguf";
  spec.context_length = 1024;
  const std::string model = dir.path() + "/tiny-llama-vocab.gguf";
  write_synthetic_model(spec, model);
  auto p = cpu_pipeline(model);
  // Greedy only: a 32,000-token vocabulary makes each new grammar state's mask cost milliseconds, and
  // sampled outputs of a random model run to the context (minutes on 2 cores); stories260K samples.
  EXPECT_GE(generate_and_validate(*p, {{0.0, 0}}, "synthetic, 32000-token llama vocabulary"), kMinCompiled);
}

GenerationResult generate(Pipeline& p, const ConstraintSpec& spec, int64_t max_tokens, double temperature = 0,
                          uint64_t seed = 0) {
  GenerationRequest req;
  req.prompt = p.tokenizer().encode("Lily", true);
  req.max_tokens = max_tokens;
  req.sampling = SamplingParams{};
  req.sampling->temperature = temperature;
  req.sampling->seed = seed;
  req.constraint = p.constraint().compile(spec);
  return run_beside(p, req);
}

TEST(ConstrainedGenerationBasics, ChoicesRegexAndGrammarsAreFollowedExactly) {
  auto p = cpu_pipeline(kStoriesF32);
  for (uint64_t seed = 0; seed < 6; ++seed) {
    const auto r = generate(*p, {"choice", R"(["yes", "no", "maybe not"])", "guided_choice"}, 20, 1.0, seed);
    EXPECT_TRUE(r.text == "yes" || r.text == "no" || r.text == "maybe not") << r.text;
    EXPECT_EQ(r.reason, FinishReason::stop);
  }
  const auto date = generate(*p, {"regex", "[0-9]{4}-[0-9]{2}-[0-9]{2}", "guided_regex"}, 30, 1.0, 3);
  EXPECT_EQ(date.text.size(), 10u) << date.text;
  EXPECT_TRUE(std::all_of(date.text.begin(), date.text.end(), [](char c) { return c == '-' || (c >= '0' && c <= '9'); }))
      << date.text;
  const auto g = generate(*p, {"grammar", "root ::= \"Lily \" (\"ran\" | \"sat\") \" \" [a-z]+ \".\"\n", "guided_grammar"}, 40, 1.0, 5);
  EXPECT_TRUE(g.text.rfind("Lily ran ", 0) == 0 || g.text.rfind("Lily sat ", 0) == 0) << g.text;
  EXPECT_EQ(g.text.back(), '.') << g.text;
}

TEST(ConstrainedGenerationBasics, AShortBudgetStillEndsInParsableJson) {
  auto p = cpu_pipeline(kStoriesF32);
  for (int64_t max_tokens : {2, 5, 12, 30}) {
    for (uint64_t seed = 0; seed < 4; ++seed) {
      const auto r = generate(*p, {"json_object", "", "response_format"}, max_tokens, 1.0, seed);
      EXPECT_TRUE(nlohmann::json::accept(r.text)) << "max_tokens " << max_tokens << ": " << r.text;
      EXPECT_LE(int64_t(r.tokens.size()), max_tokens);
    }
  }
}

TEST(ConstrainedGenerationBasics, SpeculativeDecodingKeepsTheConstraintAndGreedyTokens) {
  const std::string schema = R"({"type":"object","properties":{"name":{"type":"string","maxLength":40},
    "tags":{"type":"array","items":{"enum":["a","bb","ccc"]},"maxItems":6}},"required":["name","tags"],
    "additionalProperties":false})";
  auto plain = cpu_pipeline(kStoriesF32);
  auto spec = cpu_pipeline(kStoriesF32, {{"decoder", {{"plugin", "speculative"}, {"proposer", "ngram"}}}});
  const auto a = generate(*plain, {"json_schema", schema, "schema"}, 200);
  const auto b = generate(*spec, {"json_schema", schema, "schema"}, 200);
  EXPECT_EQ(a.tokens, b.tokens) << a.text << "\nvs\n" << b.text;
  const auto v = nlohmann::json::parse(b.text, nullptr, false);
  ASSERT_TRUE(v.is_object()) << b.text;
  EXPECT_TRUE(v.contains("name") && v.contains("tags")) << b.text;
  for (uint64_t seed = 1; seed < 4; ++seed) {
    const auto s = generate(*spec, {"json_schema", schema, "schema"}, 200, 1.0, seed);
    EXPECT_TRUE(nlohmann::json::parse(s.text, nullptr, false).is_object()) << s.text;
  }
}

}  // namespace
}  // namespace tessera
