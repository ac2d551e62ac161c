// Pipelines that read one model file with the same backend and quantizer share one load of its
// weights (PipelineOptions::share) and still generate exactly what a pipeline of their own does,
// also while both run at once; a different quantizer, or a file replaced on disk, loads anew.
#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

#include "test_util.h"
#include "tessera/engine.h"
#include "tessera/pipeline.h"

namespace tessera {
namespace {

std::vector<int32_t> greedy(Pipeline& p, const std::string& prompt, int64_t n) {
  Engine engine(p);
  GenerationRequest req;
  req.prompt = p.tokenizer().encode(prompt, true);
  req.max_tokens = n;
  req.ignore_eos = true;
  engine.submit(req);
  engine.run_until_idle();
  return engine.take_finished().at(0).tokens;
}

std::unique_ptr<Pipeline> shared_pipeline(ModelShare& share, const std::string& model, const nlohmann::json& components) {
  PipelineOptions options;
  options.share = &share;
  return Pipeline::build(test::cpu_spec(model, components), test::plugins(), options);
}

TEST(ModelShare, PipelinesOfOneFileAndQuantizerShareWeightsAndGenerateAsAlone) {
  ModelShare share;
  auto paged = shared_pipeline(share, test::kStoriesF32, {{"quantizer", {{"plugin", "int8"}}}});
  // A default spelled out is the same quantizer.
  auto contiguous = shared_pipeline(share, test::kStoriesF32,
                                    {{"quantizer", {{"plugin", "int8"}, {"keep_float", nlohmann::json::array()}}},
                                     {"cache", {{"plugin", "contiguous"}}}});
  auto other_quantizer = shared_pipeline(share, test::kStoriesF32, {{"quantizer", {{"plugin", "none"}}}});
  EXPECT_TRUE(paged->shares_weights_with(*contiguous));
  EXPECT_EQ(&paged->model(), &contiguous->model());
  EXPECT_EQ(&paged->backend(), &contiguous->backend());
  EXPECT_FALSE(paged->shares_weights_with(*other_quantizer));
  EXPECT_EQ(share.live(), 2u);
  EXPECT_NE(&paged->cache(), &contiguous->cache()) << "only the weights are shared";

  auto alone = test::cpu_pipeline(test::kStoriesF32, {{"quantizer", {{"plugin", "int8"}}}});
  const std::vector<int32_t> expected = greedy(*alone, "Once upon a time", 24);
  ASSERT_EQ(expected.size(), 24u);
  // Both engines at once on the one model: they take turns a step at a time.
  std::vector<int32_t> a, b;
  std::thread ta([&] {
    for (int i = 0; i < 3; ++i) a = greedy(*paged, "Once upon a time", 24);
  });
  std::thread tb([&] {
    for (int i = 0; i < 3; ++i) b = greedy(*contiguous, "Once upon a time", 24);
  });
  ta.join();
  tb.join();
  EXPECT_EQ(a, expected);
  EXPECT_EQ(b, expected);

  // The load lives while a pipeline holds it; the next build after that loads anew.
  const Model* first = &paged->model();
  paged.reset();
  EXPECT_EQ(&contiguous->model(), first);
  contiguous.reset();
  EXPECT_EQ(share.live(), 1u);
  auto again = shared_pipeline(share, test::kStoriesF32, {{"quantizer", {{"plugin", "int8"}}}});
  EXPECT_EQ(greedy(*again, "Once upon a time", 24), expected);
}

TEST(ModelShare, AFileReplacedOnDiskLoadsAnew) {
  test::TempDir dir;
  const std::string path = dir.path() + "/model.gguf";
  std::filesystem::copy_file(test::kStoriesF32, path);
  ModelShare share;
  auto before = shared_pipeline(share, path, {});
  // Same bytes, new modification time: what a deploy that replaces the file looks like.
  std::filesystem::last_write_time(path, std::filesystem::last_write_time(path) + std::chrono::seconds(5));
  auto after = shared_pipeline(share, path, {});
  EXPECT_FALSE(before->shares_weights_with(*after));
  auto same = shared_pipeline(share, path, {});
  EXPECT_TRUE(after->shares_weights_with(*same));
}

}  // namespace
}  // namespace tessera
