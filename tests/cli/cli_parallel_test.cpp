// Tensor parallelism through the commands a user runs: `mpirun -n 2 tessera run|eval|serve` with
// pipelines/tp2.yaml against the golden tokens and the one-process pipeline, and the refusals of a
// `parallel:` section that does not fit the launch.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include <sys/stat.h>
#include <unistd.h>

#include "test_util.h"

namespace tessera {
namespace {

using test::Output;
using test::tessera_cmd;

// `mpirun -n RANKS tessera ARGS` from the source tree (root may run it, as CI does).
Output mpirun_tessera(int ranks, const std::string& args) {
  return test::shell_cmd("cd '" TESSERA_SOURCE_DIR "' && OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 '" +
                         std::string(TESSERA_MPIEXEC) + "' --oversubscribe -n " + std::to_string(ranks) + " '" +
                         TESSERA_BINARY + "' " + args + " 2>&1");
}

#define SKIP_WITHOUT_MPIRUN() \
  if (std::string(TESSERA_MPIEXEC).empty()) GTEST_SKIP() << "no mpirun in this build (TESSERA_MPI=OFF)"

// The JSON objects of `run --format json`, one per line.
std::vector<nlohmann::json> json_lines(const std::string& text) {
  std::vector<nlohmann::json> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line[0] == '{') out.push_back(nlohmann::json::parse(line));
  }
  return out;
}

double perplexity(const Output& o) {
  const auto j = json_lines(o.text);
  return j.empty() ? NAN : j.back()["perplexity"].get<double>();
}

TEST(CliParallel, TwoRanksGiveTheGoldenGreedyTokens) {
  SKIP_WITHOUT_MPIRUN();
  std::ifstream in(test::kShared + "/golden/stories260K-f32.greedy96.json");
  const auto golden = nlohmann::json::parse(in);
  std::string prompts;
  for (const auto& g : golden) prompts += " '" + g["prompt"].get<std::string>() + "'";
  // One batch of every prompt: the ranks share each step of the engine's continuous batching.
  const Output o = mpirun_tessera(2, "run --format json -n 96 --threads 1 -p pipelines/tp2.yaml" + prompts);
  ASSERT_EQ(o.status, 0) << o.text;
  const auto runs = json_lines(o.text);
  ASSERT_EQ(runs.size(), golden.size()) << o.text;
  for (size_t i = 0; i < golden.size(); ++i) {
    SCOPED_TRACE(golden[i]["prompt"].get<std::string>());
    EXPECT_EQ(runs[i]["prompt_token_ids"], golden[i]["prompt_token_ids"]);
    EXPECT_EQ(runs[i]["completion_token_ids"], golden[i]["completion_token_ids"]);
    EXPECT_NE(runs[i]["pipeline"].get<std::string>().find("mpi tensor x2"), std::string::npos);
  }
}

// Two network namespaces joined by a veth pair, made for one test and removed after it.
class NetworkNamespaces {
 public:
  NetworkNamespaces() {
    const std::string id = std::to_string(::getpid() % 100000);
    a_ = "tsa" + id;
    b_ = "tsb" + id;
    subnet_ = "10.213." + std::to_string(::getpid() % 250) + ".";
    const std::string va = "tva" + id, vb = "tvb" + id;
    ok_ = run("ip netns add " + a_) && run("ip netns add " + b_) &&
          run("ip link add " + va + " type veth peer name " + vb) && run("ip link set " + va + " netns " + a_) &&
          run("ip link set " + vb + " netns " + b_) && in(a_, "ip addr add " + host_a() + "/24 dev " + va) &&
          in(b_, "ip addr add " + host_b() + "/24 dev " + vb) && in(a_, "ip link set " + va + " up") &&
          in(b_, "ip link set " + vb + " up") && in(a_, "ip link set lo up") && in(b_, "ip link set lo up");
  }
  ~NetworkNamespaces() {
    run("ip netns del " + a_);  // takes the veth pair with it
    run("ip netns del " + b_);
  }
  bool ok() const { return ok_; }
  const std::string& a() const { return a_; }
  const std::string& b() const { return b_; }
  std::string host_a() const { return subnet_ + "1"; }
  std::string host_b() const { return subnet_ + "2"; }
  std::string subnet() const { return subnet_ + "0/24"; }

 private:
  static bool run(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()) == 0; }
  static bool in(const std::string& ns, const std::string& cmd) { return run("ip netns exec " + ns + " " + cmd); }
  std::string a_, b_, subnet_;
  bool ok_ = false;
};

TEST(CliParallel, TwoRanksInTwoNetworkNamespacesGiveTheGoldenTokens) {
  SKIP_WITHOUT_MPIRUN();
  // One rank in each namespace, MPI's traffic over TCP between them (btl tcp,self: no shared
  // memory), as on two machines. mpirun starts the second rank through an rsh agent that enters the
  // other namespace where ssh would log in to the other host.
  if (::geteuid() != 0) GTEST_SKIP() << "network namespaces need root (ip netns)";
  NetworkNamespaces ns;
  if (!ns.ok()) GTEST_SKIP() << "this machine does not allow network namespaces and veth pairs (ip netns add, ip link add)";
  test::TempDir dir;
  const std::string agent = dir.write("agent.sh", "#!/bin/sh\nhost=$1; shift\ncase \"$host\" in " + ns.host_a() + ") n=" + ns.a() +
                                                      " ;; " + ns.host_b() + ") n=" + ns.b() +
                                                      " ;; *) exit 1 ;; esac\nexec ip netns exec \"$n\" /bin/sh -c \"$*\"\n");
  ASSERT_EQ(::chmod(agent.c_str(), 0755), 0);
  const std::string hosts = dir.write("hosts", ns.host_a() + " slots=1\n" + ns.host_b() + " slots=1\n");
  std::ifstream in(test::kShared + "/golden/stories260K-f32.greedy96.json");
  const auto golden = nlohmann::json::parse(in);
  const std::string cmd = "cd '" TESSERA_SOURCE_DIR "' && OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
                          "timeout 300 ip netns exec " + ns.a() + " '" + TESSERA_MPIEXEC + "' -n 2 --hostfile '" + hosts +
                          "' --mca plm_rsh_agent '" + agent + "' --mca btl tcp,self --mca btl_tcp_if_include " +
                          ns.subnet() + " --mca oob_tcp_if_include " + ns.subnet() + " '" + TESSERA_BINARY +
                          "' run --format json -n 96 --threads 1 -p pipelines/tp2.yaml '" +
                          golden[0]["prompt"].get<std::string>() + "' '" + golden[4]["prompt"].get<std::string>() + "' 2>&1";
  const Output o = test::shell_cmd(cmd);
  ASSERT_EQ(o.status, 0) << cmd << "\n" << o.text;
  const auto runs = json_lines(o.text);
  ASSERT_EQ(runs.size(), 2u) << o.text;
  EXPECT_EQ(runs[0]["completion_token_ids"], golden[0]["completion_token_ids"]);
  EXPECT_EQ(runs[1]["completion_token_ids"], golden[4]["completion_token_ids"]);
}

TEST(CliParallel, TwoRanksGiveTheOneProcessPerplexity) {
  SKIP_WITHOUT_MPIRUN();
  // The logits of every scored position enter the perplexity: equal to 1e-6 means the sharded
  // forward (its all-reduces summing in another order) gives the one-process logits.
  const std::string text = " --text '" + test::kShared + "/eval/tiny_stories_eval.txt'";
  const Output one = tessera_cmd("eval --format json -p pipelines/paged.yaml" + text);
  const Output two = mpirun_tessera(2, "eval --format json --threads 1 -p pipelines/tp2.yaml" + text);
  ASSERT_EQ(one.status, 0) << one.text;
  ASSERT_EQ(two.status, 0) << two.text;
  EXPECT_NEAR(perplexity(two), perplexity(one), 1e-6 * perplexity(one)) << two.text;
}

TEST(CliParallel, QuantizedBlocksSplitAlongWholeBlocks) {
  SKIP_WITHOUT_MPIRUN();
  // Block formats split by input columns (o, down) into whole blocks per rank. Activations are
  // quantized to 8 bits per block, so the all-reduce's other summation order moves a rounding here
  // and there: equal to 1e-3, where a wrong slice of a trained model's blocks would be far off.
  test::TempDir dir;
  const std::string text = " --text '" + test::kShared + "/eval/tiny_stories_eval.txt'";
  auto pipelines = [&](const std::string& model) {
    const std::string tail = "\nmodel: " + model + "\ncomponents:\n  quantizer: { plugin: gguf }\n";
    return std::pair{dir.write("one.yaml", "extends: " TESSERA_SOURCE_DIR "/pipelines/paged.yaml" + tail),
                     dir.write("tp.yaml", "extends: " TESSERA_SOURCE_DIR "/pipelines/tp2.yaml" + tail)};
  };
  auto compare = [&](const std::string& model, double reference) {
    SCOPED_TRACE(model);
    const auto [one, tp] = pipelines(model);
    const Output a = tessera_cmd("eval --format json -p '" + one + "'" + text);
    const Output b = mpirun_tessera(2, "eval --format json --threads 1 -p '" + tp + "'" + text);
    ASSERT_EQ(a.status, 0) << a.text;
    ASSERT_EQ(b.status, 0) << b.text;
    EXPECT_NEAR(perplexity(b), perplexity(a), 1e-3 * perplexity(a)) << b.text;
    if (reference > 0) EXPECT_NEAR(perplexity(b), reference, 2e-3 * reference) << b.text;
  };
  compare(test::kStoriesQ8, 4.7733);  // the reference engine's perplexity (../shared/golden)
  // Q4_K's 256-value super-blocks (a synthetic model: no reference perplexity).
  const std::string model = dir.path() + "/q4k.gguf";
  Output o = tessera_cmd("synth --preset tiny --dim 512 --ffn 1024 --layers 2 --heads 8 --kv-heads 4 --vocab 512 "
                         "--dtype q4_k -o '" + model + "'");
  ASSERT_EQ(o.status, 0) << o.text;
  compare(model, 0);
  const std::string tp = pipelines(model).second;
  // Half of 256 columns is not whole super-blocks: refused, naming the tensor.
  const std::string narrow = dir.path() + "/narrow.gguf";
  o = tessera_cmd("synth --preset tiny --dim 256 --ffn 256 --layers 1 --heads 4 --kv-heads 4 --vocab 512 --dtype q4_k -o '" +
                  narrow + "'");
  ASSERT_EQ(o.status, 0) << o.text;
  o = mpirun_tessera(2, "run -n 2 -p '" + tp + "' -m '" + narrow + "' hi");
  EXPECT_NE(o.status, 0);
  EXPECT_NE(o.text.find("does not split into 2 column ranges of whole 256-value blocks"), std::string::npos) << o.text;
}

TEST(CliParallel, AParallelSectionThatDoesNotFitTheLaunchIsRefused) {
  test::TempDir dir;
  // parallel.tensor 2 in one process: how to launch it.
  Output o = tessera_cmd("run -n 2 -p pipelines/tp2.yaml hi");
  EXPECT_NE(o.status, 0);
  EXPECT_NE(o.text.find("tp2.yaml:6: parallel.tensor is 2 but comm 'mpi' has 1 rank; launch with mpirun -n 2"),
            std::string::npos)
      << o.text;
  const std::string none = dir.write("none.yaml", "extends: " TESSERA_SOURCE_DIR "/pipelines/paged.yaml\nparallel: { tensor: 2 }\n");
  o = tessera_cmd("run -n 2 -p '" + none + "' hi");
  EXPECT_NE(o.text.find("comm 'none' has 1 rank; launch with mpirun -n 2 and set components.comm to mpi"),
            std::string::npos)
      << o.text;
  for (const auto& [yaml, message] : std::vector<std::pair<std::string, std::string>>{
           {"parallel: { pipeline: 2 }", "none.yaml:2: parallel.pipeline 2: pipeline parallelism is not built yet"},
           {"parallel: { tensor: 0 }", "none.yaml:2: parallel.tensor must be a whole number of ranks from 1 to 4096, not 0"},
           {"parallel: { tensors: 2 }", "none.yaml:2: unknown key 'parallel.tensors' (parallel has tensor, pipeline)"},
           {"parallel: 2", "none.yaml:2: 'parallel' must be a map"}}) {
    dir.write("none.yaml", "extends: " TESSERA_SOURCE_DIR "/pipelines/paged.yaml\n" + yaml + "\n");
    o = tessera_cmd("run -n 2 -p '" + none + "' hi");
    EXPECT_NE(o.status, 0);
    EXPECT_NE(o.text.find(message), std::string::npos) << o.text;
  }
  if (std::string(TESSERA_MPIEXEC).empty()) return;
  // Speculative decoding's drafts would run outside the steps the other ranks follow.
  const std::string spec = dir.write("spec.yaml", "extends: " TESSERA_SOURCE_DIR "/pipelines/speculative-self.yaml\n"
                                                  "parallel: { tensor: 2 }\ncomponents:\n  comm: { plugin: mpi }\n");
  o = mpirun_tessera(2, "run -n 2 -p '" + spec + "' hi");
  EXPECT_NE(o.status, 0);
  EXPECT_NE(o.text.find("speculative decoding under tensor parallelism is not built yet"), std::string::npos) << o.text;
  // Three processes for a pipeline of two ranks: every rank says so.
  o = mpirun_tessera(3, "run -n 2 -p pipelines/tp2.yaml hi");
  EXPECT_NE(o.status, 0);
  EXPECT_NE(o.text.find("parallel.tensor is 2 but comm 'mpi' has 3 ranks"), std::string::npos) << o.text;
}

}  // namespace
}  // namespace tessera
