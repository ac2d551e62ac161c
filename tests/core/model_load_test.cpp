// What loading a model refuses, and how: a GGUF whose metadata, weight types or weight values a
// llama cannot use (written by patching a real model's bytes, as a damaged or hand-made file would
// be), a FIFO given as the model, a thread count OpenMP cannot start, a KV pool past memory, a
// quantizer pattern that matches no weight. Each error names the file, key, tensor, setting or flag.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>

#include "test_util.h"
#include "tessera/gguf.h"
#include "tessera/gguf_writer.h"
#include "tessera/pipeline.h"
#include "tessera/pipeline_spec.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using test::message_of;

// stories260K's bytes with `patch` applied to them, written to a fresh file.
class PatchedModel {
 public:
  explicit PatchedModel(const std::string& name) : path_((fs::temp_directory_path() / name).string()) {
    bytes_ = test::read_text(test::kStoriesF32);
  }
  ~PatchedModel() { fs::remove(path_); }

  // The offset just past the first occurrence of `text` (a key's or tensor's name).
  size_t after(const std::string& text) const {
    const size_t at = bytes_.find(text);
    EXPECT_NE(at, std::string::npos) << text;
    return at + text.size();
  }
  template <class T>
  void put(size_t offset, T value) {
    std::memcpy(bytes_.data() + offset, &value, sizeof value);
  }
  const std::string& write() {
    std::ofstream(path_, std::ios::binary) << bytes_;
    return path_;
  }

 private:
  std::string path_, bytes_;
};

TEST(ModelLoad, MetadataANormOrRopeCannotUseIsRefusedNamingTheKey) {
  // A float32 value follows its key's name and its type (uint32 6).
  for (const std::string key : {"llama.attention.layer_norm_rms_epsilon", "llama.rope.freq_base"}) {
    for (const float bad : {std::numeric_limits<float>::quiet_NaN(), 0.0f, -1.0f,
                            std::numeric_limits<float>::infinity()}) {
      SCOPED_TRACE(key + " = " + std::to_string(bad));
      PatchedModel m("tessera_model_load_meta.gguf");
      m.put<float>(m.after(key) + 4, bad);
      const std::string& path = m.write();
      EXPECT_THAT(message_of([&] { test::cpu_pipeline(path); }),
                  AllOf(HasSubstr(path), HasSubstr(key), HasSubstr("must be a positive finite number")));
    }
  }
}

// stories260K rewritten through GgufWriter (its metadata types only): `extra` adds metadata and
// tensors after its own, `shape_of` may store a tensor under another shape, `edit` change its bytes.
std::string rewrite_stories(const test::TempDir& dir, const std::function<void(GgufWriter&)>& extra,
                            const std::function<std::vector<int64_t>(const GgufTensor&)>& shape_of = nullptr,
                            const std::function<void(const GgufTensor&, std::vector<uint8_t>&)>& edit = nullptr) {
  const auto f = GgufFile::open(test::kStoriesF32);
  GgufWriter w;
  for (const auto& [key, v] : f->metadata()) {
    if (v.type == GgufType::STRING) {
      w.add_string(key, std::get<std::string>(v.scalar));
    } else if (v.type == GgufType::UINT32) {
      w.add_uint32(key, uint32_t(std::get<uint64_t>(v.scalar)));
    } else if (v.type == GgufType::INT32) {
      w.add_int32(key, int32_t(std::get<int64_t>(v.scalar)));
    } else if (v.type == GgufType::FLOAT32) {
      w.add_float32(key, float(std::get<double>(v.scalar)));
    } else if (v.type == GgufType::BOOL) {
      w.add_bool(key, std::get<bool>(v.scalar));
    } else if (v.type == GgufType::ARRAY && v.elem_type == GgufType::STRING) {
      w.add_string_array(key, v.strings);
    } else if (v.type == GgufType::ARRAY && v.elem_type == GgufType::FLOAT32) {
      w.add_float32_array(key, std::vector<float>(v.floats.begin(), v.floats.end()));
    } else if (v.type == GgufType::ARRAY && v.elem_type == GgufType::INT32) {
      w.add_int32_array(key, std::vector<int32_t>(v.ints.begin(), v.ints.end()));
    } else {
      throw Error("rewrite_stories: no copy for " + key + " (" + v.type_str() + ")");
    }
  }
  for (const GgufTensor& t : f->tensors()) {
    const auto* data = static_cast<const uint8_t*>(t.data);
    std::vector<uint8_t> bytes(data, data + t.nbytes);
    if (edit) edit(t, bytes);
    w.add_tensor(t.name, shape_of ? shape_of(t) : t.shape, t.dtype, std::move(bytes));
  }
  extra(w);
  const std::string path = dir.path() + "/rewritten.gguf";
  w.write(path);
  return path;
}

TEST(ModelLoad, WhatIsNotImplementedIsRefusedNotIgnored) {
  // RoPE scaling (linear, yarn, rope_freqs.weight) and head sizes of their own load (checked against
  // the NumPy reference in arch_reference_test); what would still change the outputs unseen is
  // refused naming the key or tensor.
  test::TempDir dir;
  const std::string plain = rewrite_stories(dir, [](GgufWriter&) {});
  EXPECT_EQ(test::cpu_pipeline(plain)->model().config().dim, 64) << "the rewrite alone loads";
  auto refused = [&](const std::function<void(GgufWriter&)>& extra) {
    return message_of([&] { test::cpu_pipeline(rewrite_stories(dir, extra)); });
  };
  EXPECT_THAT(refused([](GgufWriter& w) { w.add_string("llama.rope.scaling.type", "longrope"); }),
              AllOf(HasSubstr("rewritten.gguf"), HasSubstr("llama.rope.scaling.type = longrope"), HasSubstr("not supported")));
  EXPECT_THAT(refused([](GgufWriter& w) { w.add_float32("llama.rope.scaling.factor", -2); }),
              HasSubstr("llama.rope.scaling.factor"));
  EXPECT_THAT(refused([](GgufWriter& w) { w.add_tensor("rope_freqs.weight", {4}, DType::F32, std::vector<uint8_t>(16)); }),
              HasSubstr("tensor 'rope_freqs.weight'"));
  EXPECT_THAT(refused([](GgufWriter& w) { w.add_tensor("rope_factors_long.weight", {4}, DType::F32, std::vector<uint8_t>(16)); }),
              HasSubstr("LongRoPE (tensor 'rope_factors_long.weight')"));
  EXPECT_THAT(refused([](GgufWriter& w) { w.add_uint32("llama.attention.value_length", 16); }),
              HasSubstr("llama.attention.value_length = 16"));
  // A key_length the tensors do not have: the tensor is named with both shapes.
  EXPECT_THAT(refused([](GgufWriter& w) { w.add_uint32("llama.attention.key_length", 16); }),
              AllOf(HasSubstr("tensor 'blk.0.attn_q.weight' has shape [64, 64], expected [64, 128]")));
  // Blocks past block_count are not dropped silently.
  EXPECT_THAT(refused([](GgufWriter& w) { w.add_tensor("blk.9.attn_norm.weight", {64}, DType::F32, std::vector<uint8_t>(256)); }),
              AllOf(HasSubstr("tensor 'blk.9.attn_norm.weight' belongs to block 9"), HasSubstr("block_count is 5")));
  // What changes nothing is accepted: scaling "none" (whatever factor comes with it, as llama.cpp
  // reads it), a factor of 1, the head size as it is.
  EXPECT_NO_THROW(test::cpu_pipeline(rewrite_stories(dir, [](GgufWriter& w) {
    w.add_string("llama.rope.scaling.type", "none");
    w.add_float32("llama.rope.scaling.factor", 4);
    w.add_uint32("llama.attention.key_length", 8);
  })));
  EXPECT_EQ(test::cpu_pipeline(rewrite_stories(dir, [](GgufWriter& w) { w.add_float32("llama.rope.scaling.factor", 1); }))
                ->model().config().rope_scaling, "none");
  EXPECT_EQ(test::cpu_pipeline(rewrite_stories(dir, [](GgufWriter& w) { w.add_float32("llama.rope.scaling.factor", 4); }))
                ->model().config().rope_scaling, "linear");
}

TEST(ModelLoad, TrailingDimensionsOfOneAreTheSameShape) {
  // ggml counts missing dimensions as 1 (llama.cpp accepts [64, 1] for a norm of 64).
  test::TempDir dir;
  const std::string path = rewrite_stories(dir, [](GgufWriter&) {}, [](const GgufTensor& t) {
    std::vector<int64_t> shape = t.shape;
    shape.resize(4, 1);
    return shape;
  });
  auto padded = test::cpu_pipeline(path);
  auto original = test::cpu_pipeline(test::kStoriesF32);
  GenerationRequest req;
  req.prompt = {1, 403, 407, 261, 378};
  req.max_tokens = 8;
  EXPECT_EQ(test::run_beside(*padded, req).tokens, test::run_beside(*original, req).tokens);
}

TEST(ModelLoad, IntegerWeightsAreRefusedNamingTheTensor) {
  // Tensor info: name, n_dims (uint32), dims (uint64 each), type (uint32; GGUF 24 = I8, 26 = I32).
  // Before, an I8 matrix reached the int8 kernel without scales and crashed it.
  for (const uint32_t type : {24u, 26u}) {
    SCOPED_TRACE(type);
    PatchedModel m("tessera_model_load_int.gguf");
    m.put<uint32_t>(m.after("blk.0.attn_q.weight") + 4 + 2 * 8, type);
    const std::string& path = m.write();
    for (const char* quantizer : {"none", "int8", "gguf"}) {
      SCOPED_TRACE(quantizer);
      EXPECT_THAT(message_of([&] { test::cpu_pipeline(path, {{"quantizer", {{"plugin", quantizer}}}}); }),
                  AllOf(HasSubstr(path), HasSubstr("tensor 'blk.0.attn_q.weight' is stored as"),
                        HasSubstr("not a weight type")));
    }
  }
}

TEST(ModelLoad, AWeightPastF16sRangeIsRefusedWhenConvertedToF16) {
  // Converted to f16 it would be infinity, and the first logit it reaches NaN, at generation.
  test::TempDir dir;
  const std::string path = rewrite_stories(dir, [](GgufWriter&) {}, nullptr, [](const GgufTensor& t, std::vector<uint8_t>& bytes) {
    if (t.name == "blk.1.attn_output.weight") {
      const float big = 70000.0f;
      std::memcpy(bytes.data() + 4 * 5, &big, 4);  // row 0, column 5
    }
  });
  const nlohmann::json f16 = {{"plugin", "none"}, {"dtype", "f16"}};
  EXPECT_THAT(message_of([&] { test::cpu_pipeline(path, {{"quantizer", f16}}); }),
              HasSubstr("tensor blk.1.attn_output.weight row 0 holds 70000.000000, past f16's range (65504): use bf16 or f32"));
  const nlohmann::json bf16 = {{"plugin", "none"}, {"dtype", "bf16"}};
  EXPECT_NO_THROW(test::cpu_pipeline(path, {{"quantizer", bf16}}));
}

TEST(ModelLoad, ANonFiniteWeightIsRefusedNamingTheTensorAndRow) {
  // Before, `none`, `gguf` and `int4` loaded it and generated token 0 with NaN logits.
  const auto original = GgufFile::open(test::kStoriesF32);
  const GgufTensor* t = original->find_tensor("blk.1.ffn_up.weight");
  ASSERT_NE(t, nullptr);
  const int64_t row = 5;
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
    PatchedModel m("tessera_model_load_nan.gguf");
    m.put<float>(size_t(t->offset) + size_t(row * t->row_length() + 3) * 4, bad);
    const std::string& path = m.write();
    for (const char* quantizer : {"none", "gguf", "int4"}) {
      SCOPED_TRACE(quantizer);
      EXPECT_THAT(message_of([&] { test::cpu_pipeline(path, {{"quantizer", {{"plugin", quantizer}}}}); }),
                  AllOf(HasSubstr(path), HasSubstr("tensor 'blk.1.ffn_up.weight' has a non-finite value"),
                        HasSubstr("in row 5")));
    }
  }
}

TEST(ModelLoad, AKvPoolPastMemoryNamesTheSettingsThatSizedIt) {
  // Both sizes are past the 128 TiB a process can address, so the allocation fails on any machine.
  EXPECT_THAT(message_of([] {
                test::cpu_pipeline(test::kStoriesF32, {{"cache", {{"plugin", "contiguous"}, {"max_seqs", 100000000000}}}});
              }),
              AllOf(HasSubstr("test: cache contiguous: max_seqs 100000000000 x max_len 512 tokens x "),
                    HasSubstr("does not fit: ")));
  EXPECT_THAT(message_of([] {
                test::cpu_pipeline(test::kStoriesF32, {{"cache", {{"plugin", "paged"}, {"memory", int64_t(1) << 50}}}});
              }),
              AllOf(HasSubstr("test: cache paged: memory 1125899906842624 bytes ("), HasSubstr("does not fit: ")));
}

TEST(ModelLoad, AQuantizerPatternThatMatchesNoWeightIsRefused) {
  // A typo in keep_float quantized the output layer it was meant to keep, without a word.
  const nlohmann::json typo = {{"plugin", "int4"}, {"keep_float", {"output", "ouput"}}};
  EXPECT_THAT(message_of([&] { test::cpu_pipeline(test::kStoriesF32, {{"quantizer", typo}}); }),
              AllOf(HasSubstr("test: quantizer int4: keep_float pattern 'ouput' matches no weight of "),
                    HasSubstr("stories260K-f32.gguf")));
  const nlohmann::json past_the_layers = {
      {"plugin", "int4"}, {"overrides", {{{"pattern", {"blk.0.*", "blk.77.*"}}, {"scheme", "float"}}}}};
  EXPECT_THAT(message_of([&] { test::cpu_pipeline(test::kStoriesF32, {{"quantizer", past_the_layers}}); }),
              HasSubstr("overrides pattern 'blk.77.*' matches no weight"));
  // One pattern given as a string (a list of one) is checked the same.
  const nlohmann::json one_typo = {{"plugin", "int8"}, {"keep_float", "ouput"}};
  EXPECT_THAT(message_of([&] { test::cpu_pipeline(test::kStoriesF32, {{"quantizer", one_typo}}); }),
              HasSubstr("keep_float pattern 'ouput' matches no weight"));
  const nlohmann::json plural = {{"plugin", "int4"}, {"overrides", {{{"patterns", {"ouput"}}, {"scheme", "int8"}}}}};
  EXPECT_THAT(message_of([&] { test::cpu_pipeline(test::kStoriesF32, {{"quantizer", plural}}); }),
              HasSubstr("unknown key 'patterns' (known: pattern, scheme, group_size)"));
  // Patterns that match load; "output" also names a head tied to token_embd.
  const nlohmann::json kept = {{"plugin", "int8"}, {"keep_float", {"output", "blk.1.*", "*.attn_v"}}};
  EXPECT_NO_THROW(test::cpu_pipeline(test::kStoriesF32, {{"quantizer", kept}}));
}

TEST(ModelLoad, AFifoIsRefusedAtOnceInsteadOfWaitingForAWriter) {
  const std::string path = (fs::temp_directory_path() / "tessera_model_load_fifo").string();
  fs::remove(path);
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THAT(message_of([&] { test::cpu_pipeline(path); }), AllOf(HasSubstr(path), HasSubstr("not a regular file")));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
  fs::remove(path);
}

TEST(ModelLoad, ThreadCountsOpenMpCannotStartAreRefusedNamingWhereTheyCameFrom) {
  PipelineSpec spec = default_pipeline_spec();
  spec.model = test::kStoriesF32;
  spec.backend = "cpu";
  PipelineOptions options;
  options.threads = 100000;  // OpenMP died inside GOMP_parallel on this
  EXPECT_THAT(message_of([&] { Pipeline::build(spec, test::plugins(), options); }),
              AllOf(HasSubstr("--threads"), HasSubstr("100000 threads is out of range (1 to 1024)")));

  for (const int64_t bad : {int64_t(-1), int64_t(5000)}) {
    spec.backend_params = {{"threads", bad}};
    spec.backend_where = "p.yaml:3";
    EXPECT_THAT(message_of([&] { Pipeline::build(spec, test::plugins()); }),
                HasSubstr("p.yaml:3: backend: threads = " + std::to_string(bad) + " is out of range"));
  }
  spec.backend_params = {{"threads", 2}};
  EXPECT_NO_THROW(Pipeline::build(spec, test::plugins()));
}

}  // namespace
}  // namespace tessera
