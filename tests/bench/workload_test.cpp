// Workload files: what they accept, and errors that name the file, line and field.
#include <gtest/gtest.h>

#include "tessera/bench/workload.h"
#include "tessera/error.h"
#include "test_util.h"

namespace tessera::bench {
namespace {

std::string error_of(const std::string& yaml) {
  try {
    parse_workload(yaml, "w.yaml");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Workload, ParsesClassesArrivalUsersAndSystemPrompt) {
  const Workload w = parse_workload(R"(name: mix
requests: 20
seed: 9
arrival: { process: poisson, rate: 2.5 }
users: { count: 3, distribution: zipf, s: 1.5 }
system_prompt: { length: 32, share: 0.5, scope: user }
context: clamp
classes:
  - { name: chat, weight: 3, prompt: [64, 256], output: 40 }
  - { name: code, prompt: { mean: 128, stddev: 8, min: 100, max: 150 }, output: { min: 10, max: 20 } }
)",
                                    "w.yaml");
  EXPECT_EQ(w.name, "mix");
  EXPECT_EQ(w.requests, 20);
  EXPECT_EQ(w.seed, 9u);
  EXPECT_EQ(w.arrival.process, Arrival::Process::poisson);
  EXPECT_DOUBLE_EQ(w.arrival.rate, 2.5);
  EXPECT_EQ(w.users.count, 3);
  EXPECT_TRUE(w.users.zipf);
  EXPECT_EQ(w.system.length, 32);
  EXPECT_EQ(w.system.scope, SystemPrompt::Scope::user);
  EXPECT_EQ(w.context, ContextPolicy::clamp);
  ASSERT_EQ(w.classes.size(), 2u);
  EXPECT_EQ(w.classes[0].prompt.describe(), "64-256");
  EXPECT_EQ(w.classes[0].output.describe(), "40");
  EXPECT_DOUBLE_EQ(w.classes[1].weight, 1.0);
  EXPECT_EQ(w.classes[1].prompt.describe(), "normal(128, 8) in 100-150");
  EXPECT_EQ(w.classes[1].where, "w.yaml:10");
  EXPECT_TRUE(w.ignore_eos);
}

TEST(Workload, ClosedLoopNeedsConcurrency) {
  const Workload w = parse_workload("requests: 4\narrival: {process: closed, concurrency: 3}\nclasses: [{name: a, prompt: 8, output: 8}]\n", "x/closed.yaml");
  EXPECT_EQ(w.arrival.concurrency, 3);
  EXPECT_EQ(w.name, "closed");  // from the file name
  EXPECT_EQ(error_of("requests: 4\narrival: {process: closed}\nclasses: [{name: a, prompt: 8, output: 8}]\n"),
            "w.yaml:2: a closed-loop arrival needs 'concurrency' (clients)");
}

TEST(Workload, ErrorsNameFileLineAndField) {
  const std::string head = "requests: 4\narrival: { process: poisson, rate: 1 }\n";
  EXPECT_EQ(error_of(head + "clases: []\n"),
            "w.yaml:3: unknown key 'clases' in the workload (expected one of: arrival, classes, context, description, "
            "ignore_eos, name, prompts, requests, seed, system_prompt, users)");
  EXPECT_EQ(error_of(head + "classes:\n  - { name: a, prompt: [64, 32], output: 8 }\n"),
            "w.yaml:4: 'a.prompt' has max 32 below min 64");
  EXPECT_EQ(error_of(head + "classes:\n  - { name: a, prompt: 8, output: lots }\n"),
            "w.yaml:4: 'a.output' must be an integer, got 'lots'");
  EXPECT_EQ(error_of(head + "system_prompt: { length: 8, share: 1.5 }\nclasses: [{name: a, prompt: 8, output: 8}]\n"),
            "w.yaml:3: 'system_prompt.share' is a fraction of requests (0-1), got 1.5");
  EXPECT_EQ(error_of(head + "classes:\n  - { name: a, prompt: 8, output: 8 }\n  - { name: a, prompt: 8, output: 8 }\n"),
            "w.yaml:5: request class 'a' is declared twice");
  EXPECT_EQ(error_of("requests: 4\narrival: { process: poisson, rate: 0 }\nclasses: [{name: a, prompt: 8, output: 8}]\n"),
            "w.yaml:2: 'arrival.rate' must be > 0, got 0");
  EXPECT_EQ(error_of("requests: 4\narrival: { process: burst }\n"),
            "w.yaml:2: 'arrival.process' must be one of poisson, closed, got 'burst'");
  EXPECT_EQ(error_of(head), "w.yaml: 'classes' must be a non-empty list of request classes");
  EXPECT_EQ(error_of(head + "classes: [{name: a, prompt: 8, output: 8}]\nprompts: { path: nowhere.txt }\n"),
            "w.yaml:4: prompt text file 'nowhere.txt' not found");
  EXPECT_EQ(error_of("requests: 4\n  arrival: [\n"), "w.yaml:2: invalid YAML: illegal map value");
  // Sizes that would exhaust memory or wait for years are refused, not run.
  const std::string one_class = "classes: [{name: a, prompt: 8, output: 8}]\n";
  EXPECT_EQ(error_of("requests: 100000000000\narrival: { process: closed, concurrency: 2 }\n" + one_class),
            "w.yaml:1: 'requests' is 100000000000; a trace holds at most 1000000 (each is kept until the report is "
            "written)");
  EXPECT_EQ(error_of("requests: 3\narrival: { process: poisson, rate: 1e-9 }\n" + one_class),
            "w.yaml:2: 'arrival.rate' 1e-9 requests a second spreads 3 requests over about 3000000000 s, more than "
            "a day; the rate is in requests per second");
}

TEST(Workload, LoadsAFileAndResolvesThePromptFileFromTheProjectRoot) {
  test::TempDir dir;
  std::filesystem::create_directories(dir.path() + "/configs/workloads");
  dir.write("text.txt", "Once upon a time there was a cat.");
  const std::string path = dir.write("configs/workloads/w.yaml",
                                     "requests: 2\narrival: {process: closed, concurrency: 1}\n"
                                     "prompts: { source: file, path: text.txt }\nclasses: [{name: a, prompt: 8, output: 8}]\n");
  const Workload w = load_workload(path);
  EXPECT_TRUE(w.prompts.from_file);
  EXPECT_TRUE(std::filesystem::equivalent(w.prompts.path, dir.path() + "/text.txt"));
  EXPECT_THROW(load_workload(dir.path() + "/missing.yaml"), Error);
}

TEST(Workload, ContextCheckNamesTheClassAndItsLengths) {
  Workload w = parse_workload(R"(requests: 4
arrival: { process: poisson, rate: 1 }
system_prompt: { length: 100, share: 0.5 }
classes:
  - { name: short, prompt: 64, output: 32 }
  - { name: summarise, prompt: [400, 1500], output: [32, 64] }
)",
                              "w.yaml");
  try {
    check_context(w, 512, "stories260K");
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind(
                  "w.yaml: request class 'summarise' (w.yaml:6) asks for up to 1500 prompt + 64 output tokens + 100 system "
              "prompt + BOS = 1665 tokens, but stories260K has ",
                  0),
              0u);
    EXPECT_NE(std::string(e.what()).find("context of 512"), std::string::npos);
  }
  EXPECT_TRUE(check_context(w, 2048, "m").empty());
  w.context = ContextPolicy::clamp;
  const auto clamped = check_context(w, 512, "stories260K");
  ASSERT_EQ(clamped.size(), 1u);
  EXPECT_NE(clamped[0].find("'summarise'"), std::string::npos);
}

}  // namespace
}  // namespace tessera::bench
