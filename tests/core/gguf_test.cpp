// GGUF reader: the real stories260K files, a synthetic file with every value type, and corrupt
// files that must be refused with an error naming the file and the byte offset.
#include "tessera/gguf.h"

#include "test_util.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "tessera/dtype.h"
#include "tessera/error.h"

namespace tessera {
namespace {

const std::string kShared = TESSERA_SHARED_DIR;
const std::string kF32 = kShared + "/models/stories260K/stories260K-f32.gguf";
const std::string kQ8 = kShared + "/models/stories260K/stories260K-q8_0.gguf";
const std::string kBin = kShared + "/models/stories260K/stories260K.bin";

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// ---- byte encoders for hand-made GGUF files ----
template <typename T>
std::string enc(T v) {
  std::string s(sizeof(T), '\0');
  std::memcpy(s.data(), &v, sizeof(T));
  return s;
}
std::string enc_str(std::string_view s) { return enc<uint64_t>(s.size()) + std::string(s); }
std::string enc_arr(GgufType elem, uint64_t count, const std::string& payload) {
  return enc<uint32_t>(static_cast<uint32_t>(elem)) + enc<uint64_t>(count) + payload;
}

struct TensorSpec {
  std::string name;
  std::vector<uint64_t> dims;
  uint32_t type;
  std::string data;
  std::optional<uint64_t> offset;  // relative offset override
};

// Writes header, key/values, tensor infos, padding and data; overrides make it malformed.
struct GgufBuilder {
  uint32_t version = 3;
  uint64_t alignment = 32;
  std::optional<uint64_t> n_tensors, n_kv;
  std::vector<std::pair<std::string, std::string>> kvs;  // key, type + payload
  std::vector<TensorSpec> tensors;

  void kv(const std::string& key, GgufType t, const std::string& payload) {
    kvs.emplace_back(key, enc<uint32_t>(static_cast<uint32_t>(t)) + payload);
  }
  std::string build() const {
    std::string out = "GGUF" + enc<uint32_t>(version) + enc<uint64_t>(n_tensors.value_or(tensors.size())) +
                      enc<uint64_t>(n_kv.value_or(kvs.size()));
    for (const auto& [k, v] : kvs) out += enc_str(k) + v;
    std::string data;
    for (const TensorSpec& t : tensors) {
      while (data.size() % alignment) data += '\0';
      out += enc_str(t.name) + enc<uint32_t>(static_cast<uint32_t>(t.dims.size()));
      for (uint64_t d : t.dims) out += enc<uint64_t>(d);
      out += enc<uint32_t>(t.type) + enc<uint64_t>(t.offset.value_or(data.size()));
      data += t.data;
    }
    while (out.size() % alignment) out += '\0';
    return out + data;
  }
};

class GgufTest : public ::testing::Test {
 protected:
  std::string write(const std::string& name, const std::string& bytes) { return tmp_.write(name, bytes); }

  // Asserts that opening `bytes` fails with a message naming the file, "offset" and `needle`.
  void expect_refused(const std::string& bytes, const std::string& needle, const std::string& name = "bad.gguf") {
    const std::string path = write(name, bytes);
    try {
      GgufFile::open(path);
      ADD_FAILURE() << "opened a malformed file; expected an error containing '" << needle << "'";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(path), std::string::npos) << msg;
      EXPECT_NE(msg.find("offset"), std::string::npos) << msg;
      EXPECT_NE(msg.find(needle), std::string::npos) << "missing '" << needle << "' in: " << msg;
    }
  }

  test::TempDir tmp_;
  const std::string dir_ = tmp_.path();
};

TEST_F(GgufTest, LoadsStories260KF32) {
  const auto f = GgufFile::open(kF32);
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->path(), kF32);
  EXPECT_EQ(f->file_size(), 1054240u);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->get_string("general.architecture"), "llama");
  EXPECT_EQ(f->get_string("general.name"), "stories260K");
  EXPECT_EQ(f->get_int("general.file_type"), 0);
  EXPECT_EQ(f->get_int("llama.context_length"), 512);
  EXPECT_EQ(f->get_int("llama.embedding_length"), 64);
  EXPECT_EQ(f->get_int("llama.feed_forward_length"), 172);
  EXPECT_EQ(f->get_int("llama.block_count"), 5);
  EXPECT_EQ(f->get_int("llama.attention.head_count"), 8);
  EXPECT_EQ(f->get_int("llama.attention.head_count_kv"), 4);
  EXPECT_EQ(f->get_int("llama.rope.dimension_count"), 8);
  EXPECT_DOUBLE_EQ(f->get_float("llama.rope.freq_base"), 10000.0);
  EXPECT_NEAR(f->get_float("llama.attention.layer_norm_rms_epsilon"), 1e-5, 1e-12);
  EXPECT_EQ(f->get_string("tokenizer.ggml.model"), "llama");
  EXPECT_EQ(f->get_string_array("tokenizer.ggml.tokens").size(), 512u);
  EXPECT_EQ(f->get_float_array("tokenizer.ggml.scores").size(), 512u);
  EXPECT_EQ(f->get_int_array("tokenizer.ggml.token_type").size(), 512u);
  EXPECT_EQ(f->get_int("tokenizer.ggml.bos_token_id"), 1);
  EXPECT_EQ(f->get_int("tokenizer.ggml.eos_token_id"), 2);
  EXPECT_EQ(f->get_int("tokenizer.ggml.unknown_token_id"), 0);
  EXPECT_EQ(f->get_int("general.alignment"), 32);
  EXPECT_EQ(f->find("no.such.key"), nullptr);
  EXPECT_FALSE(f->metadata().empty());
  EXPECT_EQ(f->metadata().size(), 20u);  // the keys listed in SOURCE.md

  ASSERT_EQ(f->tensors().size(), 47u);
  const GgufTensor* emb = f->find_tensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->shape, (std::vector<int64_t>{64, 512}));
  EXPECT_EQ(emb->dtype, DType::F32);
  EXPECT_EQ(emb->row_length(), 64);
  EXPECT_EQ(emb->rows(), 512);
  EXPECT_EQ(emb->nbytes, 64u * 512 * 4);
  EXPECT_EQ(f->find_tensor("output.weight"), nullptr);  // tied embeddings
  EXPECT_EQ(f->find_tensor("output_norm.weight")->shape, (std::vector<int64_t>{64}));
  EXPECT_EQ(f->find_tensor("blk.0.attn_k.weight")->shape, (std::vector<int64_t>{64, 32}));
  EXPECT_EQ(f->find_tensor("blk.4.ffn_gate.weight")->shape, (std::vector<int64_t>{64, 172}));
  EXPECT_EQ(f->find_tensor("blk.2.ffn_down.weight")->shape, (std::vector<int64_t>{172, 64}));
  EXPECT_EQ(f->find_tensor("blk.3.attn_output.weight")->shape, (std::vector<int64_t>{64, 64}));
  for (const GgufTensor& t : f->tensors()) {
    EXPECT_EQ(t.offset % 32, 0u) << t.name;
    EXPECT_GE(t.offset, f->data_offset()) << t.name;
    EXPECT_LE(t.offset + t.nbytes, f->file_size()) << t.name;
    EXPECT_EQ(t.nbytes, static_cast<size_t>(t.elements()) * 4) << t.name;
  }

  // The data must be the llama2.c checkpoint's, byte for byte: token_embedding follows the 28-byte
  // header, then rms_att (5 x 64), wq (5 x 64 x 64).
  const std::string bin = read_all(kBin);
  ASSERT_EQ(bin.size(), 1056540u);
  EXPECT_EQ(std::memcmp(emb->data, bin.data() + 28, emb->nbytes), 0);
  const size_t rms_att = 28 + 512 * 64 * 4;
  EXPECT_EQ(std::memcmp(f->find_tensor("blk.1.attn_norm.weight")->data, bin.data() + rms_att + 64 * 4, 64 * 4), 0);
  const size_t wq = rms_att + 5 * 64 * 4;
  EXPECT_EQ(std::memcmp(f->find_tensor("blk.4.attn_q.weight")->data, bin.data() + wq + 4 * 64 * 64 * 4, 64 * 64 * 4), 0);
}

TEST_F(GgufTest, Q8_0MatchesF32) {
  const auto f32 = GgufFile::open(kF32);
  const auto q8 = GgufFile::open(kQ8);
  EXPECT_EQ(q8->get_int("general.file_type"), 7);
  ASSERT_EQ(q8->tensors().size(), 47u);
  int n_q8 = 0;
  for (const GgufTensor& t : q8->tensors()) {
    const GgufTensor* ref = f32->find_tensor(t.name);
    ASSERT_NE(ref, nullptr) << t.name;
    EXPECT_EQ(t.shape, ref->shape);
    const bool quantizable = t.shape.size() == 2 && t.shape[0] % 32 == 0;
    EXPECT_EQ(t.dtype, quantizable ? DType::Q8_0 : DType::F32) << t.name;
    if (t.dtype != DType::Q8_0) continue;
    ++n_q8;
    EXPECT_EQ(t.nbytes, static_cast<size_t>(t.elements() / 32 * 34));
    const auto* src = static_cast<const uint8_t*>(t.data);
    const auto* want = static_cast<const float*>(ref->data);
    std::vector<float> row(t.row_length());
    for (int64_t r = 0; r < t.rows(); ++r) {
      dequantize_row(DType::Q8_0, src + r * dtype_row_bytes(DType::Q8_0, t.row_length()), row.data(), t.row_length());
      for (int64_t b = 0; b < t.row_length(); b += 32) {
        float amax = 0;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(want[r * t.row_length() + b + i]));
        // Half a quantization step, plus the fp16 rounding of the scale.
        const float tol = amax / 127 * 0.5f + amax * 1e-3f + 1e-7f;
        for (int i = 0; i < 32; ++i) {
          ASSERT_NEAR(row[b + i], want[r * t.row_length() + b + i], tol) << t.name << " row " << r;
        }
      }
    }
  }
  EXPECT_EQ(n_q8, 31);
}

// A synthetic file holding every value type, two tensors, and a custom alignment.
GgufBuilder all_types_file(uint32_t version) {
  GgufBuilder b;
  b.version = version;
  b.alignment = 64;
  b.kv("general.alignment", GgufType::UINT32, enc<uint32_t>(64));
  b.kv("t.u8", GgufType::UINT8, enc<uint8_t>(200));
  b.kv("t.i8", GgufType::INT8, enc<int8_t>(-100));
  b.kv("t.u16", GgufType::UINT16, enc<uint16_t>(60000));
  b.kv("t.i16", GgufType::INT16, enc<int16_t>(-30000));
  b.kv("t.u32", GgufType::UINT32, enc<uint32_t>(4000000000u));
  b.kv("t.i32", GgufType::INT32, enc<int32_t>(-2000000000));
  b.kv("t.f32", GgufType::FLOAT32, enc<float>(1.5f));
  b.kv("t.bool", GgufType::BOOL, enc<uint8_t>(1));
  b.kv("t.str", GgufType::STRING, enc_str("h\xC3\xA9llo"));
  b.kv("t.u64", GgufType::UINT64, enc<uint64_t>(123456789012ull));
  b.kv("t.u64big", GgufType::UINT64, enc<uint64_t>((1ull << 63) + 5));
  b.kv("t.i64", GgufType::INT64, enc<int64_t>(-(1ll << 40)));
  b.kv("t.f64", GgufType::FLOAT64, enc<double>(2.25));
  b.kv("t.arr_i32", GgufType::ARRAY, enc_arr(GgufType::INT32, 3, enc<int32_t>(1) + enc<int32_t>(-2) + enc<int32_t>(3)));
  b.kv("t.arr_str", GgufType::ARRAY, enc_arr(GgufType::STRING, 3, enc_str("a") + enc_str("") + enc_str("ccc")));
  b.kv("t.arr_f32", GgufType::ARRAY, enc_arr(GgufType::FLOAT32, 2, enc<float>(0.5f) + enc<float>(-1.0f)));
  b.kv("t.arr_f64", GgufType::ARRAY, enc_arr(GgufType::FLOAT64, 1, enc<double>(0.125)));
  b.kv("t.arr_bool", GgufType::ARRAY, enc_arr(GgufType::BOOL, 2, enc<uint8_t>(0) + enc<uint8_t>(1)));
  b.kv("t.arr_u8", GgufType::ARRAY, enc_arr(GgufType::UINT8, 2, enc<uint8_t>(255) + enc<uint8_t>(7)));
  b.kv("t.arr_i64", GgufType::ARRAY, enc_arr(GgufType::INT64, 2, enc<int64_t>(5) + enc<int64_t>(1ll << 40)));
  b.kv("t.arr_empty", GgufType::ARRAY, enc_arr(GgufType::INT32, 0, ""));
  b.kv("t.nested", GgufType::ARRAY,
       enc_arr(GgufType::ARRAY, 2,
               enc_arr(GgufType::UINT16, 2, enc<uint16_t>(1) + enc<uint16_t>(2)) +
                   enc_arr(GgufType::STRING, 1, enc_str("x"))));
  std::string f32data;
  for (int i = 0; i < 8; ++i) f32data += enc<float>(static_cast<float>(i) * 0.5f);
  b.tensors.push_back({"w.f32", {4, 2}, 0, f32data, {}});
  b.tensors.push_back({"w.f16", {3}, 1, enc<uint16_t>(0x3C00) + enc<uint16_t>(0xC000) + enc<uint16_t>(0x3800), {}});
  b.tensors.push_back({"w.q8", {32, 1, 1, 1}, 8, enc<uint16_t>(0x3800) + std::string(32, '\x02'), {}});
  return b;
}

TEST_F(GgufTest, AllValueTypesV2AndV3) {
  for (uint32_t version : {2u, 3u}) {
    SCOPED_TRACE("version " + std::to_string(version));
    const std::string path = write("types_v" + std::to_string(version) + ".gguf", all_types_file(version).build());
    const auto f = GgufFile::open(path);
    EXPECT_EQ(f->version(), version);
    EXPECT_EQ(f->alignment(), 64u);
    EXPECT_EQ(f->get_int("t.u8"), 200);
    EXPECT_EQ(f->get_int("t.i8"), -100);
    EXPECT_EQ(f->get_int("t.u16"), 60000);
    EXPECT_EQ(f->get_int("t.i16"), -30000);
    EXPECT_EQ(f->get_int("t.u32"), 4000000000ll);
    EXPECT_EQ(f->get_int("t.i32"), -2000000000);
    EXPECT_EQ(f->get_int("t.u64"), 123456789012ll);
    EXPECT_EQ(f->get_int("t.i64"), -(1ll << 40));
    EXPECT_THROW(f->get_int("t.u64big"), Error);  // does not fit int64
    EXPECT_EQ(std::get<uint64_t>(f->find("t.u64big")->scalar), (1ull << 63) + 5);
    EXPECT_DOUBLE_EQ(f->get_float("t.f32"), 1.5);
    EXPECT_DOUBLE_EQ(f->get_float("t.f64"), 2.25);
    EXPECT_DOUBLE_EQ(f->get_float("t.i16"), -30000.0);  // integers are accepted as floats
    EXPECT_TRUE(f->get_bool("t.bool", false));
    EXPECT_EQ(f->get_string("t.str"), "h\xC3\xA9llo");
    EXPECT_EQ(f->get_int("missing", 42), 42);
    EXPECT_DOUBLE_EQ(f->get_float("missing", 0.5), 0.5);
    EXPECT_FALSE(f->get_bool("missing", false));
    EXPECT_EQ(f->get_int("t.u8", 42), 200);
    EXPECT_EQ(f->get_int_array("t.arr_i32"), (std::vector<int32_t>{1, -2, 3}));
    EXPECT_EQ(f->get_int_array("t.arr_u8"), (std::vector<int32_t>{255, 7}));
    EXPECT_EQ(f->get_string_array("t.arr_str"), (std::vector<std::string>{"a", "", "ccc"}));
    EXPECT_EQ(f->get_float_array("t.arr_f32"), (std::vector<float>{0.5f, -1.0f}));
    EXPECT_EQ(f->get_float_array("t.arr_f64"), (std::vector<float>{0.125f}));
    EXPECT_EQ(f->get_float_array("t.arr_i32"), (std::vector<float>{1, -2, 3}));
    EXPECT_TRUE(f->get_int_array("t.arr_empty").empty());
    EXPECT_TRUE(f->get_string_array("t.arr_empty").empty());
    const GgufValue* bools = f->find("t.arr_bool");
    ASSERT_NE(bools, nullptr);
    EXPECT_EQ(bools->elem_type, GgufType::BOOL);
    EXPECT_EQ(bools->ints, (std::vector<int64_t>{0, 1}));
    const GgufValue* nested = f->find("t.nested");
    ASSERT_NE(nested, nullptr);
    EXPECT_EQ(nested->type, GgufType::ARRAY);
    EXPECT_EQ(nested->elem_type, GgufType::ARRAY);
    EXPECT_EQ(nested->type_str(), "array of array");
    ASSERT_EQ(nested->array_size(), 2u);
    EXPECT_EQ(nested->arrays[0].elem_type, GgufType::UINT16);
    EXPECT_EQ(nested->arrays[0].ints, (std::vector<int64_t>{1, 2}));
    EXPECT_EQ(nested->arrays[1].strings, (std::vector<std::string>{"x"}));

    // metadata() keeps file order.
    ASSERT_EQ(f->metadata().size(), 23u);
    EXPECT_EQ(f->metadata()[0].first, "general.alignment");
    EXPECT_EQ(f->metadata()[1].first, "t.u8");
    EXPECT_EQ(f->metadata()[22].first, "t.nested");

    // Type errors and missing keys name the file, key, and both types.
    try {
      f->get_string("t.i32");
      ADD_FAILURE();
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(path), std::string::npos) << m;
      EXPECT_NE(m.find("t.i32"), std::string::npos) << m;
      EXPECT_NE(m.find("int32"), std::string::npos) << m;
      EXPECT_NE(m.find("string"), std::string::npos) << m;
    }
    try {
      f->get_int("nope");
      ADD_FAILURE();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("'nope' not found"), std::string::npos) << e.what();
    }
    EXPECT_THROW(f->get_int("t.f32"), Error);
    EXPECT_THROW(f->get_int("t.str", 1), Error);  // present with the wrong type: no fallback
    EXPECT_THROW(f->get_float("t.str"), Error);
    EXPECT_THROW(f->get_bool("t.i8", true), Error);
    EXPECT_THROW(f->get_string_array("t.arr_i32"), Error);
    EXPECT_THROW(f->get_float_array("t.arr_str"), Error);
    EXPECT_THROW(f->get_int_array("t.arr_f32"), Error);
    EXPECT_THROW(f->get_int_array("t.arr_i64"), Error);  // 2^40 does not fit int32
    EXPECT_THROW(f->get_int_array("t.i32"), Error);

    // Tensors: shape, type, alignment-64 offsets and contents.
    ASSERT_EQ(f->tensors().size(), 3u);
    const GgufTensor* w = f->find_tensor("w.f32");
    ASSERT_NE(w, nullptr);
    EXPECT_EQ(w->shape, (std::vector<int64_t>{4, 2}));
    EXPECT_EQ(w->rows(), 2);
    EXPECT_EQ(w->offset % 64, 0u);
    EXPECT_EQ(w->offset, f->data_offset());
    EXPECT_EQ(static_cast<const float*>(w->data)[7], 3.5f);
    const GgufTensor* h = f->find_tensor("w.f16");
    ASSERT_NE(h, nullptr);
    EXPECT_EQ(h->dtype, DType::F16);
    EXPECT_EQ(h->offset, f->data_offset() + 64);
    float hv[3];
    dequantize_row(DType::F16, h->data, hv, 3);
    EXPECT_EQ(hv[1], -2.0f);
    const GgufTensor* q = f->find_tensor("w.q8");
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(q->dtype, DType::Q8_0);
    EXPECT_EQ(q->nbytes, 34u);
    EXPECT_EQ(q->rows(), 1);
    EXPECT_EQ(q->shape.size(), 4u);
  }
}

TEST_F(GgufTest, OpenErrors) {
  EXPECT_THROW(GgufFile::open(dir_ + "/does-not-exist.gguf"), Error);
  EXPECT_THROW(GgufFile::open(dir_), Error);  // a directory
  expect_refused("", "empty");
}

TEST_F(GgufTest, TruncatedSyntheticFileAtEveryByte) {
  const std::string good = all_types_file(3).build();
  ASSERT_NO_THROW(GgufFile::open(write("good.gguf", good)));
  // The last tensor's data ends exactly at the end of the file, so every shorter prefix is invalid.
  for (size_t n = 0; n < good.size(); ++n) {
    SCOPED_TRACE("truncated at " + std::to_string(n));
    expect_refused(good.substr(0, n), "");
  }
}

TEST_F(GgufTest, RandomCorruptionNeverCrashes) {
  // Flipped bytes anywhere must give either a valid file or tessera::Error, never a crash or a
  // huge allocation (run under ASan/UBSan in CI).
  const std::string good = all_types_file(3).build();
  std::mt19937 rng(42);
  int refused = 0;
  for (int iter = 0; iter < 1000; ++iter) {
    std::string bad = good;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) bad[rng() % bad.size()] = static_cast<char>(rng() % 256);
    const std::string path = write("fuzz.gguf", bad);
    try {
      const auto f = GgufFile::open(path);
      for (const GgufTensor& t : f->tensors()) ASSERT_LE(t.offset + t.nbytes, f->file_size());
    } catch (const Error& e) {
      ++refused;
      ASSERT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
  }
  EXPECT_GT(refused, 100);
}

TEST_F(GgufTest, TruncatedRealFile) {
  const std::string good = read_all(kF32);
  const auto f = GgufFile::open(kF32);
  size_t end_of_data = 0;
  for (const GgufTensor& t : f->tensors()) end_of_data = std::max(end_of_data, static_cast<size_t>(t.offset + t.nbytes));
  std::vector<size_t> cuts = {1, 3, 4, 7, 8, 15, 16, 23, 24, 25, 31, 40};
  for (size_t n = 41; n < f->data_offset() + 64; n += 97) cuts.push_back(n);  // metadata and tensor infos
  for (size_t n : {f->data_offset(), f->data_offset() + 1, f->data_offset() + 1000, good.size() / 2,
                   end_of_data - 4, end_of_data - 1}) {
    cuts.push_back(n);
  }
  for (size_t n : cuts) {
    ASSERT_LT(n, end_of_data);
    SCOPED_TRACE("truncated at " + std::to_string(n));
    expect_refused(good.substr(0, n), "", "trunc.gguf");
  }
}

TEST_F(GgufTest, BadHeaders) {
  std::string good = read_all(kF32);
  std::string bad = good;
  bad.replace(0, 4, "GGML");
  expect_refused(bad, "expected 'GGUF', found 'GGML'");
  bad.replace(0, 4, std::string("@\0\0\x80", 4));  // a NUL used to end the message there
  expect_refused(bad, "expected 'GGUF', found bytes 40 00 00 80 (not a GGUF file?)");
  for (uint32_t v : {0u, 1u, 4u, 99u, 0x03000000u}) {
    bad = good;
    bad.replace(4, 4, enc<uint32_t>(v));
    expect_refused(bad, "version " + std::to_string(v));
  }
  bad = good;
  bad.replace(8, 8, enc<uint64_t>(1ull << 62));
  expect_refused(bad, "n_tensors");
  bad = good;
  bad.replace(16, 8, enc<uint64_t>(~0ull));
  expect_refused(bad, "n_kv");
  bad = good;
  bad.replace(24, 8, enc<uint64_t>(~0ull));  // the first key's length
  expect_refused(bad, "string length 18446744073709551615");
}

TEST_F(GgufTest, BadMetadata) {
  {  // A value string longer than the file, named by key.
    GgufBuilder b;
    b.kv("general.architecture", GgufType::STRING, enc_str("llama"));
    b.kv("general.name", GgufType::STRING, enc<uint64_t>(~0ull) + "abc");
    expect_refused(b.build(), "metadata key #1 ('general.name'): string length 18446744073709551615 exceeds the file size");
  }
  {  // Array lengths that would allocate huge vectors.
    for (GgufType t : {GgufType::UINT8, GgufType::STRING, GgufType::FLOAT64, GgufType::ARRAY}) {
      GgufBuilder b;
      b.kv("tokenizer.ggml.tokens", GgufType::ARRAY, enc_arr(t, 1ull << 60, "xxxxxxxx"));
      expect_refused(b.build(), "array length 1152921504606846976");
    }
  }
  {  // A string element of an array with a bad length names the element.
    GgufBuilder b;
    b.kv("toks", GgufType::ARRAY, enc_arr(GgufType::STRING, 2, enc_str("ok") + enc<uint64_t>(1ull << 40) + "zz"));
    expect_refused(b.build(), "element #1");
  }
  {
    GgufBuilder b;
    b.kv("k", static_cast<GgufType>(13), enc<uint32_t>(0));
    expect_refused(b.build(), "value type 13");
  }
  {
    GgufBuilder b;
    b.kv("k", GgufType::ARRAY, enc_arr(static_cast<GgufType>(77), 0, ""));
    expect_refused(b.build(), "element type 77");
  }
  {
    GgufBuilder b;
    b.kv("dup", GgufType::UINT8, enc<uint8_t>(1));
    b.kv("dup", GgufType::UINT8, enc<uint8_t>(2));
    expect_refused(b.build(), "duplicate key");
  }
  {  // Deeply nested arrays are refused instead of recursing without bound.
    std::string payload = enc_arr(GgufType::UINT8, 0, "");
    for (int i = 0; i < 100; ++i) payload = enc_arr(GgufType::ARRAY, 1, payload);
    GgufBuilder b;
    b.kv("deep", GgufType::ARRAY, payload);
    expect_refused(b.build(), "nested");
  }
  for (uint32_t a : {0u, 3u, 48u}) {
    GgufBuilder b;
    b.kv("general.alignment", GgufType::UINT32, enc<uint32_t>(a));
    expect_refused(b.build(), "alignment");
  }
  {
    GgufBuilder b;
    b.kv("general.alignment", GgufType::STRING, enc_str("32"));
    expect_refused(b.build(), "alignment");
  }
  {  // A signed value is named as stored.
    GgufBuilder b;
    b.kv("general.alignment", GgufType::INT32, enc<int32_t>(-64));
    expect_refused(b.build(), "alignment -64 is not a power of two");
  }
}

TEST_F(GgufTest, BadTensors) {
  const std::string f32x64 = std::string(64 * 4, '\0');
  auto one = [&](TensorSpec t) {
    GgufBuilder b;
    b.kv("general.name", GgufType::STRING, enc_str("x"));
    b.tensors.push_back({"ok", {64}, 0, f32x64, {}});
    b.tensors.push_back(std::move(t));
    return b;
  };
  expect_refused(one({"t", {1, 1, 1, 1, 1}, 0, "", {}}).build(), "n_dims 5");
  expect_refused(one({"t", {}, 0, "", {}}).build(), "n_dims 0");
  expect_refused(one({"t", {1ull << 40, 1ull << 40}, 0, "", {}}).build(),
                 "dimensions [1099511627776, 1099511627776] make the element count overflow int64");
  expect_refused(one({"t", {~0ull}, 0, "", {}}).build(), "dimension 0");
  expect_refused(one({"t", {1ull << 40}, 0, "", {}}).build(), "exceeds the file size");
  expect_refused(one({"t", {256}, 19, std::string(50, '\0'), {}}).build(), "ggml type 19 (IQ1_S)");
  expect_refused(one({"t", {32}, 99, std::string(20, '\0'), {}}).build(), "ggml type 99");
  expect_refused(one({"t", {33}, 8, std::string(40, '\0'), {}}).build(), "not a multiple of the q8_0 block size");
  expect_refused(one({"t", {100}, 12, "", {}}).build(), "q4_k block size (256)");
  expect_refused(one({"t", {64}, 0, f32x64, 260}).build(), "not a multiple of the alignment");
  expect_refused(one({"t", {64}, 0, f32x64, 1ull << 20}).build(), "outside the file");
  expect_refused(one({"t", {64}, 0, f32x64, ~0ull - 31}).build(), "outside the file");
  expect_refused(one({"ok", {64}, 0, f32x64, {}}).build(), "duplicate tensor name");
  // An unsupported type's error names the tensor (IQ1_S: 50 bytes per 256).
  expect_refused(one({"blk.0.attn_q.weight", {256}, 19, std::string(50, '\0'), {}}).build(), "'blk.0.attn_q.weight'");
  // The same file with a valid second tensor opens.
  EXPECT_NO_THROW(GgufFile::open(write("ok.gguf", one({"t", {64}, 0, f32x64, {}}).build())));
}

}  // namespace
}  // namespace tessera
