// The tessera command as a user runs it: exit codes, JSON output, error messages.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include "test_util.h"

namespace tessera {
namespace {

struct Output {
  int status = -1;
  std::string text;  // stdout and stderr together
};

Output tessera_cmd(const std::string& args) {
  // Run from the source tree so that pipelines/default.yaml and its relative model path resolve.
  const std::string cmd = "cd '" TESSERA_SOURCE_DIR "' && '" TESSERA_BINARY "' " + args + " 2>&1";
  Output out;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return out;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) out.text.append(buf.data(), n);
  const int status = pclose(pipe);
  out.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

TEST(Cli, RunJsonGivesTokensTextAndTimingsPerPrompt) {
  const Output o = tessera_cmd("run --format json -n 12 --prompt 'Once upon a time' --prompt 'Lily and Ben'");
  ASSERT_EQ(o.status, 0) << o.text;
  std::vector<nlohmann::json> lines;
  std::stringstream ss(o.text);
  std::string line;
  while (std::getline(ss, line)) {
    if (!line.empty() && line[0] == '{') lines.push_back(nlohmann::json::parse(line));
  }
  ASSERT_EQ(lines.size(), 2u) << o.text;
  EXPECT_EQ(lines[0]["prompt_token_ids"], nlohmann::json({1, 403, 407, 261, 378}));
  EXPECT_EQ(lines[0]["completion_token_ids"],
            nlohmann::json({432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338}));
  EXPECT_EQ(lines[0]["completion_text"], ", there was a little girl named Lily. She");
  EXPECT_EQ(lines[1]["prompt"], "Lily and Ben");
  EXPECT_GT(lines[0]["timings"]["decode_tokens_per_s"].get<double>(), 0.0);
  EXPECT_GT(lines[0]["timings"]["prefill_tokens_per_s"].get<double>(), 0.0);
  EXPECT_GT(lines[0]["weight_bytes"].get<int64_t>(), 1000000);
}

TEST(Cli, ModelFlagOverridesThePipeline) {
  const Output o = tessera_cmd("run --format json -n 4 -m '" + test::kAidreamsF32 + "'");
  ASSERT_EQ(o.status, 0) << o.text;
  const auto j = nlohmann::json::parse(o.text.substr(o.text.find('{')));
  EXPECT_EQ(j["model"], test::kAidreamsF32);
  EXPECT_EQ(j["completion_token_ids"], nlohmann::json({319, 459, 355, 260}));
}

TEST(Cli, PluginsJsonListsKindNameLibraryAndParameters) {
  const Output o = tessera_cmd("plugins --format json");
  ASSERT_EQ(o.status, 0) << o.text;
  const auto j = nlohmann::json::parse(o.text);
  bool found = false;
  for (const auto& p : j["plugins"]) {
    if (p["kind"] == "cache" && p["name"] == "contiguous") {
      found = true;
      EXPECT_NE(p["library"].get<std::string>().find("libtessera_cache_contiguous.so"), std::string::npos);
      EXPECT_FALSE(p["parameters"].empty());
      EXPECT_EQ(p["parameters"][0]["name"], "max_seqs");
    }
  }
  EXPECT_TRUE(found) << o.text;
}

TEST(Cli, EvalPrintsThePerplexity) {
  const Output o = tessera_cmd("eval --format json --text '" + test::kShared + "/eval/tiny_stories_eval.txt' --ctx 128");
  ASSERT_EQ(o.status, 0) << o.text;
  const auto j = nlohmann::json::parse(o.text);
  EXPECT_NEAR(j["perplexity"].get<double>(), 4.7634, 0.02);
}

TEST(Cli, BadInputExitsNonZeroWithAClearMessage) {
  const auto dir = std::filesystem::temp_directory_path() / ("tessera_cli_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string bad = (dir / "bad.yaml").string();
  std::ofstream(bad) << "components:\n  cache: { plugin: contiguous, max_seqs: 2, colour: red }\n";
  Output o = tessera_cmd("run -p '" + bad + "' hello");
  EXPECT_EQ(o.status, 1);
  EXPECT_NE(o.text.find("bad.yaml:2"), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("unknown parameter 'colour'"), std::string::npos) << o.text;

  const std::string junk = (dir / "junk.gguf").string();
  std::ofstream(junk) << "this is not a gguf file at all";
  o = tessera_cmd("run -m '" + junk + "' hello");
  EXPECT_EQ(o.status, 1);
  EXPECT_NE(o.text.find("junk.gguf"), std::string::npos) << o.text;

  o = tessera_cmd("run --backend nosuch hello");
  EXPECT_EQ(o.status, 1);
  EXPECT_NE(o.text.find("unknown backend plugin 'nosuch'"), std::string::npos) << o.text;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

TEST(Cli, EvalAgainstABaselineReportsDeltaAndAgreement) {
  const std::string text = "--text '" + test::kShared + "/eval/tiny_stories_eval.txt'";
  // Against itself: no delta, full agreement.
  Output o = tessera_cmd("eval --format json " + text + " --baseline pipelines/default.yaml --greedy-tokens 24");
  ASSERT_EQ(o.status, 0) << o.text;
  auto j = nlohmann::json::parse(o.text);
  EXPECT_DOUBLE_EQ(j["perplexity_delta"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(j["teacher_forced_agreement"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(j["greedy_agreement"].get<double>(), 1.0);
  // The Q8_0 file against the f32 file: a small positive delta, high but imperfect agreement.
  o = tessera_cmd("eval --format json " + text + " -m '" + test::kStoriesQ8 +
                  "' --baseline pipelines/default.yaml --baseline-model '" + test::kStoriesF32 +
                  "' --prompts '" + test::kShared + "/golden/stories260K-f32.greedy96.json'");
  ASSERT_EQ(o.status, 0) << o.text;
  j = nlohmann::json::parse(o.text);
  EXPECT_NEAR(j["baseline"]["perplexity"].get<double>(), 4.7634, 0.02);
  EXPECT_GT(j["perplexity_delta_percent"].get<double>(), 0.0);
  EXPECT_LT(j["perplexity_delta_percent"].get<double>(), 1.0);
  EXPECT_GT(j["teacher_forced_agreement"].get<double>(), 0.95);
  EXPECT_LT(j["teacher_forced_agreement"].get<double>(), 1.0);
  EXPECT_EQ(j["greedy_prefix_per_prompt"].size(), 5u);
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

nlohmann::json first_json_line(const std::string& text) {
  std::stringstream ss(text);
  std::string line;
  while (std::getline(ss, line)) {
    if (!line.empty() && line[0] == '{') return nlohmann::json::parse(line);
  }
  return nlohmann::json();
}

TEST(Cli, RunStopStringsAndLogprobs) {
  // Greedy: ", there was a little girl named Lily. She"; " girl" ends it, "zzz" never matches.
  Output o = tessera_cmd("run --format json -n 20 --logprobs 3 --stop zzz --stop ' girl' 'Once upon a time'");
  ASSERT_EQ(o.status, 0) << o.text;
  auto j = first_json_line(o.text);
  EXPECT_EQ(j["completion_text"], ", there was a little");
  EXPECT_EQ(j["finish_reason"], "stop");
  const auto n = j["completion_token_ids"].size();
  ASSERT_EQ(j["logprobs"].size(), n);
  ASSERT_EQ(j["top_logprobs"].size(), n);
  for (size_t i = 0; i < n; ++i) {
    EXPECT_LE(j["logprobs"][i].get<double>(), 0.0);
    ASSERT_EQ(j["top_logprobs"][i].size(), 3u);
    // Greedy: the chosen token is the most likely one.
    EXPECT_EQ(j["top_logprobs"][i][0]["token"], j["completion_token_ids"][i]);
    EXPECT_DOUBLE_EQ(j["top_logprobs"][i][0]["logprob"].get<double>(), j["logprobs"][i].get<double>());
  }
  // Without --logprobs the JSON carries none.
  o = tessera_cmd("run --format json -n 4 --prompt 'Once upon a time'");
  ASSERT_EQ(o.status, 0) << o.text;
  EXPECT_FALSE(first_json_line(o.text).contains("logprobs"));
}

TEST(Cli, RunPenaltyAndMinPFlags) {
  const Output plain = tessera_cmd("run --format json -n 40 --ignore-eos --prompt 'Tom and his dog went to the park'");
  const Output pen = tessera_cmd(
      "run --format json -n 40 --ignore-eos --repetition-penalty 1.3 --frequency-penalty 0.4 --presence-penalty 0.3 "
      "--min-p 0.05 --prompt 'Tom and his dog went to the park'");
  ASSERT_EQ(plain.status, 0) << plain.text;
  ASSERT_EQ(pen.status, 0) << pen.text;
  EXPECT_NE(first_json_line(plain.text)["completion_token_ids"], first_json_line(pen.text)["completion_token_ids"]);
}

TEST(Cli, RunRefusesOutOfRangeSamplingFlagsNamingThem) {
  for (const auto& [flag, field] : std::vector<std::pair<std::string, std::string>>{
           {"--frequency-penalty 3", "frequency_penalty=3"},
           {"--presence-penalty -2.5", "presence_penalty=-2.5"},
           {"--min-p 1.5", "min_p=1.5"},
           {"--repetition-penalty 0", "repetition_penalty=0"},
           {"--logprobs 21", "logprobs=21"}}) {
    const Output o = tessera_cmd("run -n 2 " + flag + " hello");
    EXPECT_EQ(o.status, 1) << flag << ": " << o.text;
    EXPECT_NE(o.text.find(field), std::string::npos) << flag << ": " << o.text;
  }
}

}  // namespace
}  // namespace tessera
