// Deployment files (`tessera serve -d`): models with one pipeline or weighted variants, pipelines
// found beside the file, and errors that name the file and line.
#include <gtest/gtest.h>

#include "tessera/deployment_spec.h"
#include "tessera/error.h"
#include "test_util.h"

namespace tessera {
namespace {

class DeploymentSpecTest : public testing::Test {
 protected:
  void SetUp() override {
    tmp_.write("a.yaml", "model: " + test::kStoriesF32 + "\nbackend: cpu\n");
    tmp_.write("b.yaml", "model: " + test::kStoriesF32 + "\ncomponents:\n  cache: { plugin: paged }\n");
  }
  std::string error_of(const std::string& text) {
    const std::string path = tmp_.write("d.yaml", text);
    try {
      load_deployment_spec(path);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  test::TempDir tmp_;
};

TEST_F(DeploymentSpecTest, ModelsWithAPipelineOrVariants) {
  const std::string path = tmp_.write("d.yaml",
                                      "server: { port: 9000 }\n"
                                      "models:\n"
                                      "  - name: stories\n"
                                      "    pipeline: a.yaml\n"
                                      "  - name: chat-v2\n"
                                      "    variants:\n"
                                      "      - { name: stable, pipeline: a.yaml, weight: 95 }\n"
                                      "      - { name: canary, pipeline: b.yaml, weight: 5 }\n"
                                      "      - { name: off, pipeline: b.yaml, weight: 0 }\n");
  const DeploymentSpec d = load_deployment_spec(path);
  ASSERT_EQ(d.models.size(), 2u);
  EXPECT_EQ(d.server["port"], 9000);
  EXPECT_EQ(d.models[0].name, "stories");
  ASSERT_EQ(d.models[0].variants.size(), 1u);
  EXPECT_EQ(d.models[0].variants[0].name, "default");
  EXPECT_EQ(d.models[0].variants[0].pipeline.model, test::kStoriesF32);
  const ModelSpec& chat = d.models[1];
  ASSERT_EQ(chat.variants.size(), 3u);
  EXPECT_EQ(chat.variants[1].name, "canary");
  EXPECT_EQ(chat.variants[1].weight, 5);
  EXPECT_EQ(chat.variants[2].weight, 0);
  EXPECT_EQ(chat.variants[1].pipeline.components.at(ComponentKind::cache).plugin, "paged");
  EXPECT_NE(chat.variants[1].where.find("d.yaml:8"), std::string::npos) << chat.variants[1].where;
}

TEST_F(DeploymentSpecTest, MistakesNameTheLine) {
  const std::string head = "models:\n  - name: m\n";
  const std::pair<std::string, std::string> cases[] = {
      {"modles: []\n", "d.yaml:1: unknown key 'modles'"},
      {"server: { port: 9000 }\n", "needs 'models:'"},
      {"models: []\n", "d.yaml:1: 'models' must be a list"},
      {head + "    pipeline: a.yaml\n    variants:\n      - { name: x, pipeline: a.yaml }\n",
       "d.yaml:3: model 'm' gives both 'pipeline' and 'variants'"},
      {head, "d.yaml:2: model 'm' needs 'pipeline:' or 'variants:'"},
      {head + "    pipeline: a.yaml\n  - name: m\n    pipeline: b.yaml\n", "d.yaml:4: model 'm' is given twice"},
      {"models:\n  - name: 'a b'\n    pipeline: a.yaml\n", "d.yaml:2: model name 'a b' must be 1 to 64"},
      {head + "    variants:\n      - { name: x, pipeline: a.yaml, weight: -1 }\n", "d.yaml:4: 'weight' is '-1'"},
      {head + "    variants:\n      - { name: x, pipeline: a.yaml, weight: lots }\n", "d.yaml:4: 'weight' is 'lots'"},
      {head + "    variants:\n      - { name: x, weight: 1 }\n", "d.yaml:4: variant 'x' needs 'pipeline:'"},
      {head + "    variants:\n      - { name: x, pipeline: a.yaml }\n      - { name: x, pipeline: b.yaml }\n",
       "d.yaml:5: variant 'x' is given twice"},
      {head + "    variants:\n      - { name: x, pipeline: a.yaml, weight: 0 }\n", "add up to 0"},
      {head + "    variants:\n      - { name: x, pipeline: a.yaml, rollout: 1 }\n", "d.yaml:4: unknown key 'rollout'"},
      {head + "    pipeline: missing.yaml\n", "d.yaml:3: in pipeline: "},
      {head + "    pipeline: [a.yaml]\n", "d.yaml:3: 'pipeline' must be a non-empty text"},
      {"models:\n, x\n", "d.yaml:2: invalid YAML"},
      {head + "    variants: [{ name: x, pipeline: a.yaml }, { name: y, pipeline: a.yaml }]\n"
              "    rollback: { max_perplexity_delta: 0.5 }\n",
       "d.yaml:4: rollback: max_perplexity_delta needs eval_text"},
      {head + "    variants: [{ name: x, pipeline: a.yaml }, { name: y, pipeline: a.yaml }]\n"
              "    rollback: { max_perplexity_delta: 0.5, eval_text: nowhere.txt }\n",
       "d.yaml:4: rollback: eval_text 'nowhere.txt' is not a file"},
      {head + "    variants: [{ name: x, pipeline: a.yaml }, { name: y, pipeline: a.yaml }]\n"
              "    rollback: { max_perplexity_delta: -1 }\n",
       "d.yaml:4: rollback: 'max_perplexity_delta' is '-1'"},
  };
  for (const auto& [text, want] : cases) {
    const std::string msg = error_of(text);
    EXPECT_NE(msg.find(want), std::string::npos) << text << "\n=> " << msg;
  }
}

TEST_F(DeploymentSpecTest, TheExampleDeploymentLoads) {
  const DeploymentSpec d = load_deployment_spec(TESSERA_SOURCE_DIR "/examples/deploy.yaml");
  ASSERT_EQ(d.models.size(), 2u);
  EXPECT_EQ(d.models[1].variants.size(), 2u);
  EXPECT_EQ(d.models[1].rollback.max_perplexity_delta, 0.5);
  EXPECT_TRUE(std::filesystem::is_regular_file(d.models[1].rollback.eval_text)) << d.models[1].rollback.eval_text;
}

TEST_F(DeploymentSpecTest, APipelineIsAOneModelDeployment) {
  PipelineSpec p;
  p.path = "x.yaml";
  p.server["port"] = 1234;
  const DeploymentSpec d = single_pipeline_deployment(p, "stories");
  ASSERT_EQ(d.models.size(), 1u);
  EXPECT_EQ(d.models[0].name, "stories");
  EXPECT_EQ(d.models[0].variants.at(0).name, "default");
  EXPECT_EQ(d.server["port"], 1234);
  EXPECT_TRUE(valid_deployment_name("org/model-7b:q4_k.m"));
  EXPECT_FALSE(valid_deployment_name(""));
  EXPECT_FALSE(valid_deployment_name("a\"b"));
  EXPECT_FALSE(valid_deployment_name(std::string(65, 'a')));
}

}  // namespace
}  // namespace tessera
