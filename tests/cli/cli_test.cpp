// The tessera command as a user runs it: exit codes, JSON output, error messages.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "tessera/plugin.h"
#include "test_util.h"

namespace tessera {
namespace {

using test::Output;
using test::tessera_cmd;

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

TEST(Cli, RunFollowsAJsonSchemaGrammarOrRegexAndNamesABadOne) {
  const test::TempDir dir;
  const std::string schema = dir.path() + "/person.json";
  std::ofstream(schema) << R"({"type":"object","properties":{"name":{"type":"string","maxLength":12},
    "age":{"type":"integer","minimum":0,"maximum":120}},"required":["name","age"],"additionalProperties":false})";
  for (const char* sampling : {"", "--temperature 1 --seed 3 "}) {
    const Output o = tessera_cmd(std::string("run --format json -n 64 ") + sampling + "--json-schema '" + schema + "' 'Lily is'");
    ASSERT_EQ(o.status, 0) << o.text;
    const auto line = nlohmann::json::parse(o.text.substr(o.text.find('{')));
    const auto value = nlohmann::json::parse(line["completion_text"].get<std::string>());
    EXPECT_TRUE(value.at("name").is_string()) << value;
    EXPECT_GE(value.at("age").get<int>(), 0);
    EXPECT_LE(value.at("age").get<int>(), 120);
    EXPECT_EQ(line["finish_reason"], "stop");
  }
  const Output r = tessera_cmd("run --format json -n 16 --regex '[0-9]{3}-[a-z]{2}' Hi");
  ASSERT_EQ(r.status, 0) << r.text;
  const std::string text = nlohmann::json::parse(r.text.substr(r.text.find('{')))["completion_text"];
  EXPECT_EQ(text.size(), 6u) << text;
  EXPECT_EQ(text[3], '-') << text;

  const std::string bad = dir.path() + "/bad.gbnf";
  std::ofstream(bad) << "root ::= \"a\" item\n";
  const Output g = tessera_cmd("run -n 4 --grammar '" + bad + "' Hi");
  EXPECT_NE(g.status, 0);
  EXPECT_NE(g.text.find(bad + ":1:14: rule 'item' is used but not defined"), std::string::npos) << g.text;
  const Output two = tessera_cmd("run -n 4 --json --regex a Hi");
  EXPECT_NE(two.status, 0);
  EXPECT_NE(two.text.find("give at most one"), std::string::npos) << two.text;
}

TEST(Cli, RunWithoutDecodedTokensReportsZeroRatesNotNegativeOnes) {
  // -n 0 ends before the first token, -n 1 right after it: no decode phase to time.
  for (const char* n : {"0", "1"}) {
    const Output o = tessera_cmd(std::string("run --format json -n ") + n + " Hi");
    ASSERT_EQ(o.status, 0) << o.text;
    const auto t = nlohmann::json::parse(o.text.substr(o.text.find('{')))["timings"];
    for (const char* key : {"decode_tokens_per_s", "decode_seconds", "decode_weight_gb_per_s", "prefill_seconds"}) {
      EXPECT_GE(t[key].get<double>(), 0.0) << "-n " << n << " " << key;
    }
    EXPECT_EQ(t["decode_tokens_per_s"], 0.0) << "-n " << n;
  }
}

TEST(Cli, ModelFlagOverridesThePipeline) {
  const Output o = tessera_cmd("run --format json -n 4 -m '" + test::kAidreamsF32 + "'");
  ASSERT_EQ(o.status, 0) << o.text;
  const auto j = nlohmann::json::parse(o.text.substr(o.text.find('{')));
  EXPECT_EQ(j["model"], test::kAidreamsF32);
  EXPECT_EQ(j["completion_token_ids"], nlohmann::json({319, 459, 355, 260}));
}

// `args` run with the environment variable `name` set to `value`, unset again after.
Output tessera_cmd_with_env(const char* name, const char* value, const std::string& args) {
  ::setenv(name, value, 1);
  const Output o = tessera_cmd(args);
  ::unsetenv(name);
  return o;
}

TEST(Cli, CpuIsaCapHidesVnniKeepsTheTokensAndRefusesKernelVnni) {
  // TESSERA_CPU_ISA=avx2 runs the int kernels as on a CPU without AVX-512 VNNI (or AMX): the same tokens
  // (both kernels compute the same exact dots), and kernel vnni refused at load, naming the tensor.
  const auto dir = std::filesystem::temp_directory_path() / ("tessera_isa_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string vnni = (dir / "vnni.yaml").string();
  std::ofstream(vnni) << "extends: " TESSERA_SOURCE_DIR "/pipelines/int8.yaml\n"
                      << "components:\n  quantizer: { plugin: int8, kernel: vnni }\n";
  const std::string run = "run --format json -n 12 -p pipelines/int4.yaml -m '" + test::kStoriesF32 + "' 'Once upon'";
  const Output plain = tessera_cmd(run);
  ASSERT_EQ(plain.status, 0) << plain.text;
  ::setenv("TESSERA_CPU_ISA", "avx2", 1);
  const Output capped = tessera_cmd(run);
  const Output refused = tessera_cmd("run -n 2 -p '" + vnni + "' -m '" + test::kStoriesF32 + "' hi");
  // =vnni keeps AVX-512 VNNI but not AMX: the int8 prefill (a prompt of more than 16 tokens) on
  // VNNI tiles gives the tokens auto's AMX tiles give.
  const std::string prefill = "run --format json -n 8 -p pipelines/int8.yaml -m '" + test::kStoriesF32 +
                              "' 'Once upon a time, there was a little girl named Lily. She loved to play outside in the park.'";
  ::setenv("TESSERA_CPU_ISA", "vnni", 1);
  const Output no_amx = tessera_cmd(prefill);
  ::unsetenv("TESSERA_CPU_ISA");
  const Output any = tessera_cmd(prefill);
  ::setenv("TESSERA_CPU_ISA", "avx512", 1);
  const Output unknown = tessera_cmd(run);
  ::setenv("TESSERA_CPU_ISA", "", 1);  // set but empty: as unset
  const char* tuning = std::getenv("TESSERA_CPU_TUNING");
  const std::optional<std::string> saved_tuning = tuning ? std::optional<std::string>(tuning) : std::nullopt;
  ::setenv("TESSERA_CPU_TUNING", "", 1);
  const Output empty = tessera_cmd(run);
  ::unsetenv("TESSERA_CPU_ISA");
  if (saved_tuning) {
    ::setenv("TESSERA_CPU_TUNING", saved_tuning->c_str(), 1);
  } else {
    ::unsetenv("TESSERA_CPU_TUNING");
  }
  std::filesystem::remove_all(dir);
  ASSERT_EQ(capped.status, 0) << capped.text;
  const auto ids = [](const Output& o) {
    return nlohmann::json::parse(o.text.substr(o.text.find('{')))["completion_token_ids"];
  };
  EXPECT_EQ(ids(capped), ids(plain));
  ASSERT_EQ(no_amx.status, 0) << no_amx.text;
  ASSERT_EQ(any.status, 0) << any.text;
  EXPECT_EQ(ids(no_amx), ids(any));
  EXPECT_EQ(refused.status, 1);
  EXPECT_NE(refused.text.find("needs AVX-512 VNNI"), std::string::npos) << refused.text;
  EXPECT_NE(refused.text.find("blk.0.attn_q.weight"), std::string::npos) << refused.text;
  EXPECT_NE(refused.text.find(vnni + ":3: quantizer 'int8'"), std::string::npos) << refused.text;  // #51: file:line
  EXPECT_EQ(unknown.status, 1);
  EXPECT_NE(unknown.text.find("TESSERA_CPU_ISA is 'avx512'"), std::string::npos) << unknown.text;
  ASSERT_EQ(empty.status, 0) << empty.text;
  EXPECT_EQ(ids(empty), ids(plain));
}

TEST(Cli, CpuIsaCapKeepsEveryLogprobToTheBit) {
  // Where the CPU has AVX-512, the f32 GEMM tiles and attention (512-bit score and value sums; a GQA
  // group's queries, or an MHA head's consecutive positions, two at a time) must compute what their
  // AVX2 twins compute, to the bit: the same log-probabilities with TESSERA_CPU_ISA=avx2 as without,
  // with an f32 and an f16 cache, for heads of 64 in groups of 3 over a 191-token prompt, and
  // without groups over 760 tokens (segments of 96 keys: blocks of 64 and 32, and pairs whose later
  // query starts a block or a segment alone). (Without AVX-512 both runs take the AVX2 code.)
  const std::string sentence = "Once upon a time there was a little girl named Lily who loved to play in the park "
                               "with her friends and her dog every single day of the summer ";
  struct Case {
    const char* shape;
    int repeats;
  };
  for (const Case& c : {Case{"--heads 6 --kv-heads 2", 2}, Case{"--heads 6 --kv-heads 6", 8}}) {
    const auto model = std::filesystem::temp_directory_path() / ("tessera_isa_" + std::to_string(::getpid()) + ".gguf");
    ASSERT_EQ(tessera_cmd(std::string("synth --preset tiny --dim 384 ") + c.shape +
                          " --layers 2 --vocab 512 --context 1024 -o '" + model.string() + "'")
                  .status,
              0);
    std::string prompt;
    for (int i = 0; i < c.repeats; ++i) prompt += sentence;
    const auto logprobs = [](const Output& o) {
      return nlohmann::json::parse(o.text.substr(o.text.find('{')))["logprobs"];
    };
    for (const char* pipeline : {"default.yaml", "kv-f16.yaml"}) {
      SCOPED_TRACE(std::string(c.shape) + ", " + pipeline);
      const std::string run = std::string("run --format json --logprobs 2 -n 6 -p pipelines/") + pipeline + " -m '" +
                              model.string() + "' '" + prompt + "'";
      const Output any = tessera_cmd(run);
      const Output capped = tessera_cmd_with_env("TESSERA_CPU_ISA", "avx2", run);
      ASSERT_EQ(any.status, 0) << any.text;
      ASSERT_EQ(capped.status, 0) << capped.text;
      ASSERT_FALSE(logprobs(any).empty()) << any.text;
      EXPECT_EQ(logprobs(capped), logprobs(any));
    }
    std::filesystem::remove(model);
  }
}

TEST(Cli, CpuTuningKeepsTheTokensOfEveryWeightFormatAndRefusesAnUnknownOne) {
  // TESSERA_CPU_TUNING picks how decode GEMVs read their weights (streams, software prefetch), not
  // what they compute: amd and intel give the same tokens for f32, int8, int4 and GGUF Q8_0/Q4_0
  // on any CPU, whichever its vendor would pick.
  const auto ids = [](const Output& o) {
    return nlohmann::json::parse(o.text.substr(o.text.find('{')))["completion_token_ids"];
  };
  const auto q4 = std::filesystem::temp_directory_path() / ("tessera_tuning_q4_" + std::to_string(::getpid()) + ".gguf");
  ASSERT_EQ(tessera_cmd("synth --preset tiny --dtype q4_0 -o '" + q4.string() + "'").status, 0);
  const std::pair<const char*, std::string> runs[] = {
      {"baseline.yaml", test::kStoriesF32}, {"int8.yaml", test::kStoriesF32}, {"int4.yaml", test::kStoriesF32},
      {"gguf.yaml", test::kStoriesQ8}, {"gguf.yaml", q4.string()}};
  for (const auto& [pipeline, model] : runs) {
    const std::string run = std::string("run --format json -n 16 -p pipelines/") + pipeline + " -m '" + model + "' 'Once upon'";
    const Output amd = tessera_cmd_with_env("TESSERA_CPU_TUNING", "amd", run);
    const Output intel = tessera_cmd_with_env("TESSERA_CPU_TUNING", "intel", run);
    ASSERT_EQ(amd.status, 0) << amd.text;
    ASSERT_EQ(intel.status, 0) << intel.text;
    EXPECT_EQ(ids(intel), ids(amd)) << pipeline << " " << model;
  }
  std::filesystem::remove(q4);
  ::setenv("TESSERA_CPU_TUNING", "zen", 1);
  const Output unknown = tessera_cmd("run -n 2 -m '" + test::kStoriesF32 + "' hi");
  ::unsetenv("TESSERA_CPU_TUNING");
  EXPECT_EQ(unknown.status, 1);
  EXPECT_NE(unknown.text.find("TESSERA_CPU_TUNING is 'zen'"), std::string::npos) << unknown.text;
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

TEST(Cli, PluginsMarkdownDocumentsEveryParameterWithoutMachinePaths) {
  const Output o = tessera_cmd("plugins --format markdown");
  ASSERT_EQ(o.status, 0) << o.text;
  for (const char* kind : {"quantizer", "attention", "cache", "scheduler", "decoder", "backend"}) {
    EXPECT_NE(("\n" + o.text).find(std::string("\n## ") + kind + "\n"), std::string::npos) << kind;
  }
  EXPECT_NE(o.text.find("### `fcfs`\n\nFirst come, first served"), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("| `max_seqs` | integer | `16` | sequences running at once |"), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("| `kernel` | string: `auto`, `vnni`, `avx2`, `reference` | `\"auto\"` |"), std::string::npos) << o.text;
  EXPECT_EQ(o.text.find(".so"), std::string::npos) << "library paths differ per machine: " << o.text;
}

TEST(Cli, PluginsMarkdownRefusesWhenALibraryFailsToLoad) {
  // A reference missing a plugin would be wrong without saying so.
  test::TempDir dir;
  std::filesystem::copy_file(TESSERA_TEST_LIB_DIR "/libtestlib_bad_abi.so", dir.path() + "/libtessera_bad_abi.so");
  ::setenv("TESSERA_PLUGIN_PATH", dir.path().c_str(), 1);
  const Output o = tessera_cmd("plugins --format markdown");
  ::unsetenv("TESSERA_PLUGIN_PATH");
  EXPECT_NE(o.status, 0) << o.text;
  EXPECT_NE(o.text.find("cannot document every plugin"), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("libtessera_bad_abi.so: plugin ABI version"), std::string::npos) << o.text;
}

TEST(Cli, VersionNamesThePluginAbiAndBuildIdentity) {
  const Output o = tessera_cmd("--version");
  ASSERT_EQ(o.status, 0) << o.text;
  EXPECT_NE(o.text.find("plugin ABI " + std::to_string(TESSERA_ABI_VERSION)), std::string::npos) << o.text;
  EXPECT_NE(o.text.find(TESSERA_BUILD_ID), std::string::npos) << o.text;
}

TEST(Cli, EvalPrintsThePerplexity) {
  const Output o = tessera_cmd("eval --format json --text '" + test::kShared + "/eval/tiny_stories_eval.txt' --ctx 128");
  ASSERT_EQ(o.status, 0) << o.text;
  const auto j = nlohmann::json::parse(o.text);
  EXPECT_NEAR(j["perplexity"].get<double>(), 4.7634, 0.02);
}

TEST(Cli, EvalsDefaultChunkFitsAShortContext) {
  // --ctx defaults to 128, or to the model's context where that is shorter (64 here).
  test::TempDir dir;
  const std::string model = dir.path() + "/ctx64.gguf";
  ASSERT_EQ(tessera_cmd("synth --preset tiny --context 64 -o '" + model + "'").status, 0);
  const Output o = tessera_cmd("eval -m '" + model + "' --text '" + test::kShared + "/eval/tiny_stories_eval.txt'");
  EXPECT_EQ(o.status, 0) << o.text;
  EXPECT_NE(o.text.find(" chunks of 64,"), std::string::npos) << o.text;
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

  o = tessera_cmd("run -m '" + dir.string() + "' hello");  // a folder, not a file
  EXPECT_EQ(o.status, 1);
  EXPECT_NE(o.text.find("-m: model '" + dir.string() + "' is not a regular file (a GGUF file is expected)"),
            std::string::npos)
      << o.text;

  o = tessera_cmd("run --backend nosuch hello");
  EXPECT_EQ(o.status, 1);
  EXPECT_NE(o.text.find("unknown backend plugin 'nosuch'"), std::string::npos) << o.text;

  // A bad command line exits 1 too, not with CLI11's own codes (105, 109, ...).
  o = tessera_cmd("run --bogus hello");
  EXPECT_EQ(o.status, 1) << o.text;
  EXPECT_NE(o.text.find("--bogus"), std::string::npos) << o.text;
  o = tessera_cmd("bench --accuracy-ctx 2 --workload configs/workloads/chat.yaml");
  EXPECT_EQ(o.status, 1) << o.text;
  EXPECT_NE(o.text.find("--accuracy-ctx: Value 2 not in range 4"), std::string::npos) << o.text;

  o = tessera_cmd("bogus");
  EXPECT_EQ(o.status, 1);
  EXPECT_NE(o.text.find("unknown command 'bogus' (commands: run, plugins, eval, synth, serve, bench, tokenize)"),
            std::string::npos)
      << o.text;

  // The baseline's model is named by its own flag.
  o = tessera_cmd("eval --text README.md --baseline pipelines/baseline.yaml --baseline-model /no/such.gguf");
  EXPECT_EQ(o.status, 1);
  EXPECT_NE(o.text.find("--baseline-model: model file '/no/such.gguf' not found"), std::string::npos) << o.text;
  std::filesystem::remove_all(dir);
}

TEST(Cli, OutputThatCannotBeWrittenExitsOneAndSaysSo) {
  // A full disk (/dev/full) must not pass for a complete answer.
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full on this system";
  const auto err = std::filesystem::temp_directory_path() / ("tessera_cli_err_" + std::to_string(::getpid()));
  for (const std::string cmd : {"run -n 8 hello", "run -n 8 --format json hello", "plugins --format json"}) {
    const Output o =
        tessera_cmd(cmd + " >/dev/full 2>'" + err.string() + "'; s=$?; cat '" + err.string() + "'; exit $s");
    EXPECT_EQ(o.status, 1) << cmd << ": " << o.text;
    EXPECT_NE(o.text.find("error: could not write the output to standard output"), std::string::npos) << cmd << ": "
                                                                                                       << o.text;
  }
  std::filesystem::remove(err);
}

TEST(Cli, LogitsThatOverflowFailTheRequestAndTheEvalNamingTheCause) {
  // stories260K with output_norm scaled up to float's limit: every weight finite (so the file
  // loads), the head's sums past it. Greedy argmax over NaN would "choose" token 0 and a KL
  // divergence of max(0, NaN) read 0.
  test::TempDir dir;
  const std::string path = test::write_overflowing_model(dir);
  Output o = tessera_cmd("run -m '" + path + "' -n 4 hello");
  EXPECT_EQ(o.status, 1) << o.text;
  EXPECT_NE(o.text.find("the model's logits are not finite (NaN or infinity) at generated token 1"), std::string::npos)
      << o.text;
  o = tessera_cmd("eval -m '" + path + "' --text '" + test::kShared + "/eval/tiny_stories_eval.txt' --ctx 128");
  EXPECT_EQ(o.status, 1) << o.text;
  EXPECT_NE(o.text.find("perplexity: the model's logits are not finite"), std::string::npos) << o.text;
  o = tessera_cmd("eval --text '" + test::kShared + "/eval/tiny_stories_eval.txt' --ctx 128 --baseline " +
                  "pipelines/default.yaml --baseline-model '" + path + "'");
  EXPECT_EQ(o.status, 1) << o.text;
  EXPECT_NE(o.text.find("perplexity: the baseline's logits are not finite"), std::string::npos) << o.text;
}

TEST(Cli, AnInheritedDraftModelPathIsFoundFromTheFileThatWroteIt) {
  // base/spec.yaml names its draft model relative to itself (base/models/draft.gguf); other/child.yaml
  // extends it and restates the decoder, inheriting that path, which resolves neither from the
  // working directory nor from the child's folder.
  test::TempDir dir;
  std::filesystem::create_directories(dir.path() + "/base/models");
  std::filesystem::create_directories(dir.path() + "/other");
  std::filesystem::copy_file(test::kStoriesQ8, dir.path() + "/base/models/draft.gguf");
  dir.write("base/spec.yaml", "extends: " TESSERA_SOURCE_DIR "/pipelines/default.yaml\n"
                              "components:\n  decoder: { plugin: speculative, proposer: draft_model, "
                              "draft_model: models/draft.gguf }\n");
  const std::string child = dir.write("other/child.yaml", "extends: ../base/spec.yaml\n"
                                                          "components:\n  decoder: { plugin: speculative, window: 2 }\n");
  const Output o = tessera_cmd("run -p '" + child + "' -n 8 'Once upon a time'");
  EXPECT_EQ(o.status, 0) << o.text;
  EXPECT_NE(o.text.find("drafts accepted"), std::string::npos) << o.text;
}

TEST(Cli, AQuantizerThatQuantizesNoWeightSaysSo) {
  // stories260K's rows are 64 and 172 long: groups of 128 fit none of them, so every weight stays
  // f32 and the run would otherwise pass for an int4 one.
  const auto dir = std::filesystem::temp_directory_path() / ("tessera_cli_q_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string g128 = (dir / "g128.yaml").string();
  std::ofstream(g128) << "extends: " TESSERA_SOURCE_DIR "/pipelines/default.yaml\n"
                      << "components:\n  quantizer: { plugin: int4, group_size: 128 }\n";
  Output o = tessera_cmd("run -n 2 -p '" + g128 + "' Hi");
  EXPECT_EQ(o.status, 0) << o.text;
  EXPECT_NE(o.text.find("warning: the quantizer quantized no weight"), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("not a multiple of 128"), std::string::npos) << o.text;
  o = tessera_cmd("run -n 2 -p pipelines/int4.yaml --format json Hi");
  EXPECT_EQ(o.status, 0) << o.text;
  EXPECT_EQ(o.text.find("warning"), std::string::npos) << o.text;
  EXPECT_NE(nlohmann::json::parse(o.text)["weights"].get<std::string>().find("int4/g32"), std::string::npos) << o.text;
  // synth too: Q4_K blocks of 256 hold no row of the tiny model.
  o = tessera_cmd("synth --preset tiny --dtype q4_k -o '" + (dir / "t.gguf").string() + "'");
  EXPECT_EQ(o.status, 0) << o.text;
  EXPECT_NE(o.text.find("note: every matrix stays f32: rows of 64 and 172 are not whole q4_k blocks of 256"),
            std::string::npos)
      << o.text;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

TEST(Cli, EvalComparisonFlagsNeedABaseline) {
  for (const char* flag : {"--prompts p.json", "--greedy-tokens 8", "--baseline-model m.gguf"}) {
    const Output o = tessera_cmd("eval --text '" + test::kShared + "/eval/tiny_stories_eval.txt' " + flag);
    EXPECT_NE(o.status, 0) << flag;
    EXPECT_NE(o.text.find("requires --baseline"), std::string::npos) << flag << ": " << o.text;
  }
}

TEST(Cli, EvalRefusesABaselineWhoseVocabularyDiffers) {
  // stories260K and aidreams260K both have 512 tokens, with different meanings.
  const Output o = tessera_cmd("eval --text '" + test::kShared + "/eval/tiny_stories_eval.txt' --baseline '" +
                               std::string(TESSERA_SOURCE_DIR) + "/pipelines/default.yaml' --baseline-model '" +
                               test::kAidreamsF32 + "'");
  EXPECT_NE(o.status, 0) << o.text;
  EXPECT_NE(o.text.find("vocabulary mismatch: token "), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("aidreams260K-f32.gguf"), std::string::npos) << o.text;
}

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

TEST(Cli, EvalSensitivityRanksTheQuantizedWeightsKeptInFloat) {
  const std::string text = "--text '" + test::kShared + "/eval/tiny_stories_eval.txt'";
  // int8 quantizes all 36 weights of stories260K (q, k, v, o, gate, up, down of 5 blocks, the head).
  Output o = tessera_cmd("eval --format json -p pipelines/int8.yaml --sensitivity " + text);
  ASSERT_EQ(o.status, 0) << o.text;
  EXPECT_NE(o.text.find("[36/36] "), std::string::npos) << "progress on stderr: " << o.text;
  const auto j = nlohmann::json::parse(o.text.substr(o.text.find('{')));
  const auto& list = j["keep_float_sensitivity"];
  ASSERT_EQ(list.size(), 36u);
  const double ppl = j["perplexity"].get<double>();
  for (size_t i = 0; i < list.size(); ++i) {
    SCOPED_TRACE(list[i].dump());
    EXPECT_EQ(list[i]["format"], "int8");
    EXPECT_GT(list[i]["extra_weight_bytes"].get<int64_t>(), 0);
    const double p = list[i]["perplexity"].get<double>();
    EXPECT_NEAR(list[i]["perplexity_change_percent"].get<double>(), 100.0 * (p - ppl) / ppl, 1e-9);
    EXPECT_FALSE(list[i].contains("kl_mean")) << "no baseline";
    if (i > 0) EXPECT_LE(list[i - 1]["perplexity"].get<double>(), p) << "most helpful first";
  }
  o = tessera_cmd("eval -p pipelines/int8.yaml --sensitivity " + text);
  ASSERT_EQ(o.status, 0) << o.text;
  EXPECT_NE(o.text.find("keep_float sensitivity: the perplexity with one more weight kept in float"), std::string::npos)
      << o.text;
  EXPECT_NE(o.text.find("  " + list[0]["tensor"].get<std::string>() + " "), std::string::npos) << o.text;
  // By block: blk.0.* .. blk.4.* (7 weights each) and the head alone.
  o = tessera_cmd("eval --format json -p pipelines/int8.yaml --sensitivity --sensitivity-by block " + text);
  ASSERT_EQ(o.status, 0) << o.text;
  const auto blocks = nlohmann::json::parse(o.text.substr(o.text.find('{')))["keep_float_sensitivity"];
  ASSERT_EQ(blocks.size(), 6u);
  for (const auto& b : blocks) {
    const bool head = b["tensor"] == "output.weight";
    EXPECT_TRUE(head || b["tensor"].get<std::string>().starts_with("blk.")) << b;
    EXPECT_EQ(b["weights"], head ? 1 : 7) << b;
  }
  // Against a baseline each entry has its KL divergence from it, the lowest first.
  o = tessera_cmd("eval --format json -p pipelines/int8.yaml --sensitivity --sensitivity-by kind --baseline "
                  "pipelines/default.yaml --greedy-tokens 8 " + text);
  ASSERT_EQ(o.status, 0) << o.text;
  const auto kinds = nlohmann::json::parse(o.text.substr(o.text.find('{')))["keep_float_sensitivity"];
  ASSERT_EQ(kinds.size(), 8u);  // q, k, v, o, gate, up, down, the head
  for (size_t i = 0; i < kinds.size(); ++i) {
    ASSERT_TRUE(kinds[i].contains("kl_mean")) << kinds[i];
    if (i > 0) EXPECT_LE(kinds[i - 1]["kl_mean"].get<double>(), kinds[i]["kl_mean"].get<double>());
  }
  // Without a quantizer that quantizes there is nothing to scan: refused before any scoring.
  o = tessera_cmd("eval --sensitivity " + text);
  EXPECT_EQ(o.status, 1) << o.text;
  EXPECT_NE(o.text.find("quantizer 'none' has no keep_float parameter"), std::string::npos) << o.text;
  EXPECT_EQ(o.text.find("perplexity "), std::string::npos) << o.text;
  // Greedy-agreement inputs are checked before any scoring: nothing is computed to be thrown away.
  for (const std::string bad : {"--prompts /no/such/prompts.json", "--greedy-tokens 600"}) {
    o = tessera_cmd("eval -p pipelines/int8.yaml --sensitivity --sensitivity-by kind --baseline pipelines/default.yaml " +
                    bad + " " + text);
    EXPECT_EQ(o.status, 1) << o.text;
    EXPECT_EQ(o.text.find("[1/"), std::string::npos) << "no sensitivity pass ran: " << o.text;
  }
  // keep_float given as one string (a list of one) is extended like a list.
  test::TempDir dir;
  const std::string one = dir.write("one.yaml", "extends: " TESSERA_SOURCE_DIR "/pipelines/int8.yaml\n"
                                                "components:\n  quantizer: { plugin: int8, keep_float: output }\n");
  o = tessera_cmd("eval --format json -p " + one + " --sensitivity --sensitivity-by kind " + text);
  ASSERT_EQ(o.status, 0) << o.text;
  EXPECT_EQ(nlohmann::json::parse(o.text.substr(o.text.find('{')))["keep_float_sensitivity"].size(), 7u) << o.text;
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
  // Text output has nowhere to show them: said, not ignored.
  o = tessera_cmd("run -n 4 --logprobs 2 'Once upon a time'");
  EXPECT_NE(o.status, 0);
  EXPECT_NE(o.text.find("--logprobs: log-probabilities are reported in JSON output; add --format json"),
            std::string::npos)
      << o.text;
}

TEST(Cli, RunSaysWhenTheContextEndedGenerationBeforeMaxTokens) {
  // stories260K's context is 512 tokens: -n past it stops there, and the status line says why.
  Output o = tessera_cmd("run -n 100000 --ignore-eos 'Once upon a time'");
  ASSERT_EQ(o.status, 0) << o.text;
  EXPECT_NE(o.text.find("finish: length (full: the model's context of 512 tokens)"), std::string::npos) << o.text;
  o = tessera_cmd("run -n 5 'Once upon a time'");
  ASSERT_EQ(o.status, 0) << o.text;
  EXPECT_NE(o.text.find("finish: length]"), std::string::npos) << o.text;
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
           {"--logprobs 21", "logprobs=21"},
           {"--logprobs 1000000", "logprobs=1000000:"}}) {
    const Output o = tessera_cmd("run -n 2 " + flag + " hello");
    EXPECT_EQ(o.status, 1) << flag << ": " << o.text;
    EXPECT_NE(o.text.find(field), std::string::npos) << flag << ": " << o.text;
  }
  // Negative counts and seeds past 64 bits: a short message, not CLI11's range up to the largest
  // double or a silently saturated seed.
  for (const auto& [flag, message] : std::vector<std::pair<std::string, std::string>>{
           {"-n -1", "--max-tokens: must be >= 0, got -1"},
           {"--top-k x", "--top-k: 'x' is not a number"},
           {"--seed 99999999999999999999", "--seed: must be an integer in 0..18446744073709551615"}}) {
    const Output o = tessera_cmd("run " + flag + " hello");
    EXPECT_NE(o.status, 0) << flag;
    EXPECT_NE(o.text.find(message), std::string::npos) << flag << ": " << o.text;
    EXPECT_LT(o.text.size(), 200u) << o.text;
  }
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

TEST(Cli, RunSpeculativePipelineGivesThePlainOutputAndReportsAcceptance) {
  const Output o = tessera_cmd("run --format json -n 24 -p pipelines/speculative.yaml 'Once upon a time'");
  ASSERT_EQ(o.status, 0) << o.text;
  std::vector<nlohmann::json> lines;
  std::stringstream ss(o.text);
  std::string line;
  while (std::getline(ss, line)) {
    if (!line.empty() && line[0] == '{') lines.push_back(nlohmann::json::parse(line));
  }
  ASSERT_EQ(lines.size(), 2u) << o.text;
  EXPECT_EQ(lines[0]["completion_token_ids"],
            nlohmann::json({432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401, 396, 267, 337, 410, 408,
                            419, 292, 411, 322, 265, 282}));
  const auto& s = lines[1]["speculation"];
  EXPECT_GT(s["proposed"].get<int64_t>(), 0);
  EXPECT_GT(s["accepted"].get<int64_t>(), 0);
  EXPECT_LE(s["acceptance_rate"].get<double>(), 1.0);
  EXPECT_GT(s["mean_accepted_length"].get<double>(), 0.0);
}

}  // namespace
}  // namespace tessera
