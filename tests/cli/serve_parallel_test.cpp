// `mpirun -n 2 tessera serve -p pipelines/tp2.yaml`: rank 0 answers the OpenAI API with the
// completions one process gives, for requests one at a time, at once (one batch) and streamed;
// SIGTERM to mpirun ends the job.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <future>

#include "serve_test_util.h"

namespace tessera {
namespace {

using nlohmann::json;
using test::ServerProcess;

TEST(ServeParallel, TwoRanksAnswerWithTheOneProcessCompletions) {
  if (std::string(TESSERA_MPIEXEC).empty()) GTEST_SKIP() << "no mpirun in this build (TESSERA_MPI=OFF)";
  ::setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);  // CI runs as root
  ::setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  ServerProcess one({"-p", "pipelines/paged.yaml"});
  ServerProcess two({"-p", "pipelines/tp2.yaml"}, {TESSERA_MPIEXEC, "--oversubscribe", "-n", "2"}, "1");
  std::ifstream in(test::kShared + "/golden/stories260K-f32.greedy96.json");
  const auto golden = json::parse(in);
  auto a = one.client(), b = two.client();
  std::vector<json> bodies;
  for (const auto& g : golden) bodies.push_back({{"prompt", g["prompt"]}, {"max_tokens", 40}});
  std::vector<std::string> expected;
  for (const json& body : bodies) {
    const json r = test::post_json(a, "/v1/completions", body);
    expected.push_back(r["choices"][0]["text"].get<std::string>());
    EXPECT_EQ(test::post_json(b, "/v1/completions", body)["choices"][0]["text"], expected.back()) << body.dump();
  }
  // All at once: the engine batches them, each step shared by the two ranks.
  std::vector<std::future<json>> answers;
  for (const json& body : bodies) {
    answers.push_back(std::async(std::launch::async, [&two, body] {
      auto c = two.client();
      return test::post_json(c, "/v1/completions", body);
    }));
  }
  for (size_t i = 0; i < answers.size(); ++i) EXPECT_EQ(answers[i].get()["choices"][0]["text"], expected[i]);
  // Streamed.
  json body = bodies[0];
  body["stream"] = true;
  auto res = b.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(test::parse_stream(res->body).text, expected[0]);
  res = b.Get("/health");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_NE(two.log().find("mpi tensor x2"), std::string::npos) << two.log();
  // mpirun passes SIGTERM on: rank 0 finishes its requests and stops, its pipeline going releases
  // rank 1, and the job ends (mpirun itself exits 1 when signalled, whatever its ranks did).
  EXPECT_GE(two.stop(SIGTERM, std::chrono::seconds(30)), 0) << "mpirun did not end: " << two.log();
  EXPECT_NE(two.log().find("tessera serve: stopped"), std::string::npos) << two.log();
}

}  // namespace
}  // namespace tessera
