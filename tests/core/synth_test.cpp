// GgufWriter, the block quantizers and `tessera synth`: files written here must read back through
// GgufFile bit for bit, quantized rows must stay within the format's error bound, and synthetic
// models must load in the real pipeline and generate varied tokens with finite logits.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "test_util.h"
#include "tessera/dtype.h"
#include "tessera/engine.h"
#include "tessera/error.h"
#include "tessera/gguf.h"
#include "tessera/gguf_writer.h"
#include "tessera/quantize_blocks.h"
#include "tessera/synth.h"
#include "tessera/tokenizer.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// A fresh temporary directory per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "tessera_synth_XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw Error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

using test::message_of;

std::vector<float> random_floats(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// ---------------------------------------------------------------- writer

TEST(GgufWriter, EveryValueTypeAndTensorTypeRoundTripsThroughGgufFile) {
  TempDir dir;
  GgufWriter w;
  w.add_string("general.architecture", "test");
  w.set_alignment(64);
  w.add_uint8("t.u8", 200);
  w.add_int8("t.i8", -100);
  w.add_uint16("t.u16", 60000);
  w.add_int16("t.i16", -30000);
  w.add_uint32("t.u32", 4000000000u);
  w.add_int32("t.i32", -2000000000);
  w.add_uint64("t.u64", 18000000000000000000ull);
  w.add_int64("t.i64", -9000000000000000000ll);
  w.add_float32("t.f32", 0.125f);
  w.add_float64("t.f64", 1e-300);
  w.add_bool("t.true", true);
  w.add_bool("t.false", false);
  w.add_string("t.str", "h\xC3\xA9llo \xE2\x96\x81 world");
  w.add_string("t.empty_str", "");
  const std::vector<std::string> strs = {"a", "", "\xE2\x96\x81the", std::string(300, 'x')};
  w.add_string_array("t.strs", strs);
  const std::vector<float> f32s = {1.5f, -2.25f, 1e-30f};
  w.add_float32_array("t.f32s", f32s);
  const std::vector<double> f64s = {3.5, -1e200};
  w.add_float64_array("t.f64s", f64s);
  const std::vector<int32_t> i32s = {-1, 0, 2147483647};
  w.add_int32_array("t.i32s", i32s);
  const std::vector<uint32_t> u32s = {4000000000u, 7};
  w.add_uint32_array("t.u32s", u32s);
  const std::vector<int64_t> i64s = {-5, 1ll << 40};
  w.add_int64_array("t.i64s", i64s);
  const std::vector<uint8_t> u8s = {0, 255};
  w.add_uint8_array("t.u8s", u8s);
  const bool bools[] = {true, false, true};
  w.add_bool_array("t.bools", bools);
  w.add_int32_array("t.empty", std::span<const int32_t>());

  // One tensor of every type GGUF can hold, odd sizes so that padding is needed.
  struct Case {
    std::string name;
    std::vector<int64_t> shape;
    DType dtype;
  };
  const std::vector<Case> cases = {
      {"f32", {3}, DType::F32},           {"f16", {5, 3}, DType::F16},      {"bf16", {7, 1, 2}, DType::BF16},
      {"q8_0", {64, 3}, DType::Q8_0},     {"q4_0", {32, 5}, DType::Q4_0},   {"q4_k", {256, 1}, DType::Q4_K},
      {"q6_k", {256, 2}, DType::Q6_K},    {"i8", {9}, DType::I8},           {"i32", {2, 3, 2, 1}, DType::I32},
  };
  std::vector<std::vector<uint8_t>> data;
  std::mt19937 rng(1);
  for (const Case& c : cases) {
    int64_t rows = 1;
    for (size_t i = 1; i < c.shape.size(); ++i) rows *= c.shape[i];
    std::vector<uint8_t> bytes(dtype_row_bytes(c.dtype, c.shape[0]) * static_cast<size_t>(rows));
    for (auto& b : bytes) b = static_cast<uint8_t>(rng());
    data.push_back(bytes);
    if (c.name == "q8_0") {  // one streamed tensor
      w.add_tensor(c.name, c.shape, c.dtype, [bytes](uint8_t* dst, size_t n) {
        ASSERT_EQ(n, bytes.size());
        std::memcpy(dst, bytes.data(), n);
      });
    } else {
      w.add_tensor(c.name, c.shape, c.dtype, bytes);
    }
  }
  const std::string path = dir.file("all.gguf");
  w.write(path);
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  EXPECT_EQ(fs::file_size(path), w.file_size());

  const auto f = GgufFile::open(path);
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(f->data_offset() % 64, 0u);
  EXPECT_EQ(f->metadata().size(), 25u);
  EXPECT_EQ(f->metadata()[0].first, "general.architecture");
  EXPECT_EQ(f->find("general.alignment")->type, GgufType::UINT32);
  EXPECT_EQ(f->find("t.u8")->type, GgufType::UINT8);
  EXPECT_EQ(f->get_int("t.u8"), 200);
  EXPECT_EQ(f->find("t.i8")->type, GgufType::INT8);
  EXPECT_EQ(f->get_int("t.i8"), -100);
  EXPECT_EQ(f->find("t.u16")->type, GgufType::UINT16);
  EXPECT_EQ(f->get_int("t.u16"), 60000);
  EXPECT_EQ(f->get_int("t.i16"), -30000);
  EXPECT_EQ(f->find("t.u32")->type, GgufType::UINT32);
  EXPECT_EQ(f->get_int("t.u32"), 4000000000ll);
  EXPECT_EQ(f->find("t.i32")->type, GgufType::INT32);
  EXPECT_EQ(f->get_int("t.i32"), -2000000000);
  EXPECT_EQ(std::get<uint64_t>(f->find("t.u64")->scalar), 18000000000000000000ull);
  EXPECT_EQ(f->get_int("t.i64"), -9000000000000000000ll);
  EXPECT_EQ(f->find("t.f32")->type, GgufType::FLOAT32);
  EXPECT_EQ(f->get_float("t.f32"), 0.125);
  EXPECT_EQ(f->find("t.f64")->type, GgufType::FLOAT64);
  EXPECT_EQ(f->get_float("t.f64"), 1e-300);
  EXPECT_TRUE(f->get_bool("t.true", false));
  EXPECT_FALSE(f->get_bool("t.false", true));
  EXPECT_EQ(f->get_string("t.str"), "h\xC3\xA9llo \xE2\x96\x81 world");
  EXPECT_EQ(f->get_string("t.empty_str"), "");
  EXPECT_EQ(f->get_string_array("t.strs"), strs);
  EXPECT_EQ(f->get_float_array("t.f32s"), f32s);
  EXPECT_EQ(f->find("t.f64s")->elem_type, GgufType::FLOAT64);
  EXPECT_EQ(f->find("t.f64s")->floats, f64s);
  EXPECT_EQ(f->find("t.i32s")->elem_type, GgufType::INT32);
  EXPECT_EQ(f->get_int_array("t.i32s"), i32s);
  EXPECT_EQ(f->find("t.u32s")->elem_type, GgufType::UINT32);
  EXPECT_EQ(f->find("t.u32s")->ints, (std::vector<int64_t>{4000000000ll, 7}));
  EXPECT_EQ(f->find("t.i64s")->ints, i64s);
  EXPECT_EQ(f->find("t.u8s")->ints, (std::vector<int64_t>{0, 255}));
  EXPECT_EQ(f->find("t.bools")->elem_type, GgufType::BOOL);
  EXPECT_EQ(f->find("t.bools")->ints, (std::vector<int64_t>{1, 0, 1}));
  EXPECT_EQ(f->find("t.empty")->array_size(), 0u);

  ASSERT_EQ(f->tensors().size(), cases.size());
  const std::string raw = test::read_text(path);
  uint64_t end_of_previous = f->data_offset();
  for (size_t i = 0; i < cases.size(); ++i) {
    const GgufTensor& t = f->tensors()[i];
    SCOPED_TRACE(t.name);
    EXPECT_EQ(t.name, cases[i].name);
    EXPECT_EQ(t.shape, cases[i].shape);
    EXPECT_EQ(t.dtype, cases[i].dtype);
    // Packed in order with padding between, as ggml's reader requires (offset = running sum).
    EXPECT_EQ(t.offset, (end_of_previous + 63) / 64 * 64);
    ASSERT_EQ(t.nbytes, data[i].size());
    EXPECT_EQ(std::memcmp(t.data, data[i].data(), t.nbytes), 0);
    // The gap before each tensor (alignment padding) is zero.
    for (uint64_t b = end_of_previous; b < t.offset; ++b) ASSERT_EQ(raw[b], '\0') << "byte " << b;
    end_of_previous = t.offset + t.nbytes;
  }
  EXPECT_EQ(raw.size() % 64, 0u) << "the last tensor is padded too";
  for (uint64_t b = end_of_previous; b < raw.size(); ++b) ASSERT_EQ(raw[b], '\0');
}

TEST(GgufWriter, DefaultAlignmentIs32AndTheKeyIsOptional) {
  TempDir dir;
  GgufWriter w;
  w.add_string("general.architecture", "test");
  w.add_tensor("a", {3}, DType::F32, std::vector<uint8_t>(12, 1));
  w.add_tensor("b", {5}, DType::F32, std::vector<uint8_t>(20, 2));
  w.write(dir.file("m.gguf"));
  const auto f = GgufFile::open(dir.file("m.gguf"));
  EXPECT_EQ(f->find("general.alignment"), nullptr);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->tensors()[1].offset - f->tensors()[0].offset, 32u);
}

TEST(GgufWriter, RefusesBadInputWithClearErrors) {
  GgufWriter w;
  w.add_uint32("k", 1);
  EXPECT_THAT(message_of([&] { w.add_uint32("k", 2); }), HasSubstr("duplicate metadata key 'k'"));
  EXPECT_THAT(message_of([&] { w.add_string("", "x"); }), HasSubstr("empty metadata key"));
  EXPECT_THAT(message_of([&] { w.set_alignment(48); }), HasSubstr("power of two"));
  EXPECT_THAT(message_of([&] { w.add_uint64("general.alignment", 32); }), HasSubstr("uint32"));
  w.add_tensor("t", {32}, DType::F32, std::vector<uint8_t>(128));
  EXPECT_THAT(message_of([&] { w.add_tensor("t", {32}, DType::F32, std::vector<uint8_t>(128)); }),
              HasSubstr("duplicate tensor name"));
  EXPECT_THAT(message_of([&] { w.add_tensor("q", {48}, DType::Q8_0, std::vector<uint8_t>(51)); }),
              HasSubstr("not a whole number of q8_0 blocks"));
  EXPECT_THAT(message_of([&] { w.add_tensor("s", {4}, DType::F32, std::vector<uint8_t>(15)); }),
              HasSubstr("15 bytes given, its shape and type need 16"));
  EXPECT_THAT(message_of([&] { w.add_tensor(std::string(64, 'n'), {4}, DType::F32, std::vector<uint8_t>(16)); }),
              HasSubstr("1 to 63 bytes"));
  EXPECT_THAT(message_of([&] { w.add_tensor("d", {4, 0}, DType::F32, std::vector<uint8_t>()); }),
              HasSubstr("not positive"));
  EXPECT_THAT(message_of([&] { w.add_tensor("five", {1, 1, 1, 1, 1}, DType::F32, std::vector<uint8_t>(4)); }),
              HasSubstr("1 to 4 dimensions"));
  EXPECT_THAT(message_of([&] { w.add_tensor("i4", {4}, DType::I4, std::vector<uint8_t>(2)); }),
              HasSubstr("GGUF has no tensor type for int4"));
  EXPECT_EQ(w.tensor_count(), 1u);
}

TEST(GgufWriter, AFailedWriteLeavesNoFileAndKeepsTheOldOne) {
  TempDir dir;
  const std::string path = dir.file("m.gguf");
  {
    std::ofstream(path) << "old contents";
  }
  GgufWriter w;
  w.add_tensor("ok", {4}, DType::F32, std::vector<uint8_t>(16));
  w.add_tensor("bad", {4}, DType::F32, [](uint8_t*, size_t) { throw Error("generator failed"); });
  const std::string msg = message_of([&] { w.write(path); });
  EXPECT_THAT(msg, HasSubstr(path));
  EXPECT_THAT(msg, HasSubstr("tensor 'bad': generator failed"));
  EXPECT_EQ(test::read_text(path), "old contents");
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  const std::string missing = dir.file("no/such/dir/m.gguf");
  EXPECT_THAT(message_of([&] { w.write(missing); }), HasSubstr(missing + ": cannot create"));
}

// ---------------------------------------------------------------- quantization

TEST(QuantizeBlocks, Q4_0MatchesGgmlOnAHandComputedBlock) {
  // x = -16..15: the largest magnitude is -16, so d = -16 / -8 = 2 and q = floor(x/2 + 8.5).
  std::vector<float> x(32);
  for (int i = 0; i < 32; ++i) x[i] = static_cast<float>(i - 16);
  uint8_t block[18];
  quantize_row(DType::Q4_0, x.data(), block, 32);
  uint16_t d;
  std::memcpy(&d, block, 2);
  EXPECT_EQ(fp16_to_f32(d), 2.0f);
  EXPECT_EQ(block[2], 0x80);       // x0 = -16 -> 0, x16 = 0 -> 8
  EXPECT_EQ(block[2 + 15], 0xF8);  // x15 = -1 -> 8, x31 = 15 -> 16 clamped to 15
}

TEST(QuantizeBlocks, Q8_0AndQ4_0StayWithinTheirErrorBounds) {
  for (float scale : {1e-3f, 0.02f, 1.0f, 300.0f}) {
    const int64_t n = 32 * 64;
    std::vector<float> x = random_floats(n, 7, scale);
    x[5] = 0;
    std::fill(x.begin() + 64, x.begin() + 96, 0.0f);  // an all-zero block
    for (DType t : {DType::Q8_0, DType::Q4_0}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " scale " + std::to_string(scale));
      std::vector<uint8_t> q(dtype_row_bytes(t, n));
      quantize_row(t, x.data(), q.data(), n);
      std::vector<float> y(n);
      dequantize_row(t, q.data(), y.data(), n);
      const size_t block_bytes = dtype_block_bytes(t);
      for (int64_t b = 0; b < n / 32; ++b) {
        uint16_t h;
        std::memcpy(&h, q.data() + b * block_bytes, 2);
        const float signed_d = fp16_to_f32(h), d = std::fabs(signed_d);
        float amax = 0;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
        // d is amax/127 (Q8_0) or amax/8 (Q4_0), up to fp16 rounding.
        EXPECT_NEAR(d, amax / (t == DType::Q8_0 ? 127.0f : 8.0f), amax * 1e-3f);
        for (int i = 0; i < 32; ++i) {
          const float xi = x[b * 32 + i], err = std::fabs(y[b * 32 + i] - xi);
          // Half a step plus the fp16 rounding of d over up to 127 (8) steps. In Q4_0 the side
          // opposite the largest magnitude has one level fewer and may be a whole step off.
          const bool clipped = t == DType::Q4_0 && xi / signed_d > 7.5f * 0.999f;
          const float bound = (clipped ? d : 0.5f * d) + (t == DType::Q8_0 ? 127 : 8) * d * 1e-3f + 1e-30f;
          ASSERT_LE(err, bound) << "block " << b << " element " << i << " x " << xi << " d " << d;
        }
      }
      for (int i = 64; i < 96; ++i) EXPECT_EQ(y[i], 0.0f);
    }
  }
}

TEST(QuantizeBlocks, KQuantsStayWithinTheirStepsAndRoundTripThroughTheReader) {
  for (float scale : {1e-3f, 0.02f, 1.0f, 300.0f}) {
    const int64_t n = 256 * 8;
    std::vector<float> x = random_floats(n, 11, scale);
    std::fill(x.begin() + 256, x.begin() + 512, 0.0f);        // an all-zero super-block
    for (int i = 512; i < 768; ++i) x[size_t(i)] = std::fabs(x[size_t(i)]);  // one with no negatives
    for (DType t : {DType::Q4_K, DType::Q6_K}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " scale " + std::to_string(scale));
      std::vector<uint8_t> q(dtype_row_bytes(t, n));
      quantize_row(t, x.data(), q.data(), n);
      std::vector<float> y(n);
      dequantize_row(t, q.data(), y.data(), n);
      // Per sub-block (32 for Q4_K, 16 for Q6_K) the error stays within a few steps of its range
      // (half a step, plus the 6- or 8-bit rounding of the sub-block's scale and min), plus the
      // fp16 rounding of the super-block scale, which ggml's quantizer (and so ours) does not
      // compensate: below fp16's normal range it is off by up to 2^-25 absolute, times sc·q.
      const int64_t sub = t == DType::Q4_K ? 32 : 16;
      const float levels = t == DType::Q4_K ? 15.0f : 63.0f;
      const float fp16_slack = std::ldexp(1.0f, -25) * (t == DType::Q4_K ? 63.0f * 15.0f + 63.0f : 128.0f * 32.0f);
      double err2 = 0, x2 = 0;
      for (int64_t b = 0; b < n / sub; ++b) {
        float lo = 0, hi = 0;
        for (int64_t i = 0; i < sub; ++i) {
          lo = std::min(lo, x[size_t(b * sub + i)]);
          hi = std::max(hi, x[size_t(b * sub + i)]);
        }
        const float step = (hi - lo) / levels;
        for (int64_t i = 0; i < sub; ++i) {
          const float xi = x[size_t(b * sub + i)], err = std::fabs(y[size_t(b * sub + i)] - xi);
          ASSERT_LE(err, 2.0f * step + fp16_slack) << "element " << b * sub + i << " x " << xi;
          err2 += double(err) * err;
          x2 += double(xi) * xi;
        }
      }
      EXPECT_LT(std::sqrt(err2 / x2), t == DType::Q4_K ? 0.12 : 0.03);
      for (int i = 256; i < 512; ++i) EXPECT_EQ(y[size_t(i)], 0.0f);
    }
  }
}

TEST(QuantizeBlocks, KQuantsStayFiniteBeyondTheirFp16Scales) {
  // Super-block scales are fp16: past its range a block clips, below it keeps the smallest step;
  // it never decodes to inf or NaN.
  for (float scale : {1e-8f, 1e8f}) {
    const int64_t n = 512;
    const std::vector<float> x = random_floats(n, 5, scale);
    for (DType t : {DType::Q4_K, DType::Q6_K}) {
      std::vector<uint8_t> q(dtype_row_bytes(t, n));
      quantize_row(t, x.data(), q.data(), n);
      std::vector<float> y(n);
      dequantize_row(t, q.data(), y.data(), n);
      for (int64_t i = 0; i < n; ++i) ASSERT_TRUE(std::isfinite(y[size_t(i)])) << dtype_name(t) << " " << scale;
    }
  }
}

TEST(QuantizeBlocks, FloatFormatsRoundTrip) {
  const std::vector<float> x = {0.0f, 1.0f, -2.5f, 65504.0f, 1e-3f, 3.14159f, -1e-7f, 1e30f};
  std::vector<float> y(x.size());
  std::vector<uint8_t> buf(x.size() * 4);
  quantize_row(DType::F32, x.data(), buf.data(), 8);
  dequantize_row(DType::F32, buf.data(), y.data(), 8);
  EXPECT_EQ(x, y);
  quantize_row(DType::F16, x.data(), buf.data(), 8);
  dequantize_row(DType::F16, buf.data(), y.data(), 8);
  for (size_t i = 0; i < 6; ++i) EXPECT_NEAR(y[i], x[i], std::fabs(x[i]) * 1e-3f) << i;
  EXPECT_TRUE(std::isinf(y[7]));
  quantize_row(DType::BF16, x.data(), buf.data(), 8);
  dequantize_row(DType::BF16, buf.data(), y.data(), 8);
  for (size_t i = 0; i < 8; ++i) EXPECT_NEAR(y[i], x[i], std::fabs(x[i]) * 4e-3f) << i;
}

TEST(QuantizeBlocks, RefusesFormatsItCannotWriteAndPartialBlocks) {
  std::vector<float> x(256);
  std::vector<uint8_t> out(1024);
  EXPECT_FALSE(quantize_supported(DType::I32));
  EXPECT_THAT(message_of([&] { quantize_row(DType::I32, x.data(), out.data(), 8); }),
              HasSubstr("cannot quantize f32 to int32"));
  EXPECT_THAT(message_of([&] { quantize_row(DType::I8, x.data(), out.data(), 8); }), HasSubstr("int8"));
  EXPECT_THAT(message_of([&] { quantize_row(DType::Q8_0, x.data(), out.data(), 48); }),
              HasSubstr("not a whole number of q8_0 blocks"));
  EXPECT_THAT(message_of([&] { quantize_row(DType::Q4_K, x.data(), out.data(), 128); }),
              HasSubstr("not a whole number of q4_k"));
}

// ---------------------------------------------------------------- presets and vocabulary

TEST(Synth, PresetsHaveTheDocumentedShapes) {
  const SynthSpec a = synth_preset("110m");
  EXPECT_EQ(std::tie(a.dim, a.ffn_dim, a.n_layers, a.n_heads, a.n_kv_heads, a.vocab, a.context_length),
            std::make_tuple(768, 2048, 12, 12, 12, 32000, 1024));
  const SynthSpec g = synth_preset("110m-gqa");
  EXPECT_EQ(g.n_kv_heads, 4);
  EXPECT_EQ(g.dim, 768);
  const SynthSpec b = synth_preset("1b");
  EXPECT_EQ(std::tie(b.dim, b.ffn_dim, b.n_layers, b.n_heads, b.n_kv_heads, b.vocab, b.context_length),
            std::make_tuple(2048, 5632, 22, 32, 4, 32000, 2048));
  EXPECT_NEAR(synth_parameter_count(b) / 1e9, 1.1, 0.01);  // TinyLlama's shape
  const SynthSpec t = synth_preset("tiny");
  EXPECT_EQ(std::tie(t.dim, t.ffn_dim, t.n_layers, t.n_heads, t.n_kv_heads, t.vocab, t.context_length),
            std::make_tuple(64, 172, 2, 4, 2, 512, 256));
  for (const auto& name : synth_preset_names()) EXPECT_NO_THROW(validate_synth_spec(synth_preset(name))) << name;
}

TEST(Synth, UnknownPresetsAndBadShapesGiveClearErrors) {
  EXPECT_THAT(message_of([] { synth_preset("7b"); }),
              HasSubstr("unknown synth preset '7b' (presets: tiny, 110m, 110m-gqa, 1b)"));
  auto bad = [](auto change) {
    SynthSpec s = synth_preset("tiny");
    change(s);
    return message_of([&] { validate_synth_spec(s); });
  };
  EXPECT_THAT(bad([](SynthSpec& s) { s.n_heads = 6; }), HasSubstr("heads = 6 does not divide dim = 64"));
  EXPECT_THAT(bad([](SynthSpec& s) { s.n_kv_heads = 3; }), HasSubstr("kv_heads = 3 does not divide heads = 4"));
  EXPECT_THAT(bad([](SynthSpec& s) { s.n_layers = 0; }), HasSubstr("layers = 0 is outside"));
  EXPECT_THAT(bad([](SynthSpec& s) { s.vocab = 100; }), HasSubstr("vocab = 100 is outside 260.."));
  EXPECT_THAT(bad([](SynthSpec& s) { s.dim = 36; s.n_heads = 4; s.n_kv_heads = 4; }),
              HasSubstr("the head size 9 must be even for RoPE"));
  EXPECT_THAT(bad([](SynthSpec& s) { s.rope_theta = 0; }), HasSubstr("rope_theta"));
  // Written as float32: a double past its range would become inf or 0 in the file.
  EXPECT_THAT(bad([](SynthSpec& s) { s.rope_theta = 1e39; }), HasSubstr("rope_theta = 1e+39 must be a positive number a float32 holds"));
  EXPECT_THAT(bad([](SynthSpec& s) { s.rms_eps = 1e-50; }), HasSubstr("rms_eps = 1e-50 must be a positive number a float32 holds"));
  EXPECT_THAT(bad([](SynthSpec& s) { s.n_layers = 4097; }), HasSubstr("layers = 4097 is outside 1..4096"));
  EXPECT_THAT(bad([](SynthSpec& s) { s.dtype = DType::I8; }), HasSubstr("dtype int8 is not supported"));
  TempDir dir;
  SynthSpec s = synth_preset("tiny");
  s.n_heads = 5;
  EXPECT_THAT(message_of([&] { write_synthetic_model(s, dir.file("x.gguf")); }), HasSubstr("does not divide"));
  EXPECT_FALSE(fs::exists(dir.file("x.gguf")));
  // A mistyped size that no disk holds is refused at once, before any work.
  s = synth_preset("tiny");
  s.dim = 16777216;
  s.vocab = 16777216;
  EXPECT_THAT(message_of([&] { write_synthetic_model(s, dir.file("x.gguf")); }),
              testing::AllOf(HasSubstr("synth: the model would take about"), HasSubstr("bytes free in " + dir.path().string())));
  EXPECT_FALSE(fs::exists(dir.file("x.gguf")));
  // Fields each in range whose byte count is past an int64's reach: a size, in bytes, refused.
  s = synth_preset("tiny");
  s.dim = s.ffn_dim = 16777216;
  s.n_heads = s.n_kv_heads = 8388608;
  s.n_layers = 4000;
  EXPECT_THAT(message_of([&] { write_synthetic_model(s, dir.file("x.gguf")); }), HasSubstr("would take about 3.15e+19 bytes"));
  s = synth_preset("tiny");
  EXPECT_THAT(message_of([&] { write_synthetic_model(s, ""); }), HasSubstr("the file name is empty"));
}

TEST(Synth, VocabularyIsDistinctTypedRankedAndDeterministic) {
  const Vocabulary v = synth_vocabulary(32000);
  ASSERT_EQ(v.tokens.size(), 32000u);
  EXPECT_EQ(std::set<std::string>(v.tokens.begin(), v.tokens.end()).size(), 32000u);
  EXPECT_EQ(v.tokens[0], "<unk>");
  EXPECT_EQ(v.tokens[1], "<s>");
  EXPECT_EQ(v.tokens[2], "</s>");
  EXPECT_EQ((std::vector<int32_t>{v.types[0], v.types[1], v.types[2]}), (std::vector<int32_t>{2, 3, 3}));
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    EXPECT_EQ(v.tokens[3 + b], buf);
    EXPECT_EQ(v.types[3 + b], kTokenByte);
  }
  for (size_t i = 259; i < v.tokens.size(); ++i) {
    ASSERT_EQ(v.types[i], kTokenNormal) << i;
    ASSERT_EQ(v.scores[i], -static_cast<float>(i - 259)) << i;
  }
  const std::set<std::string> all(v.tokens.begin(), v.tokens.end());
  for (const char* piece : {"\xE2\x96\x81the", "\xE2\x96\x81" "a", "e", "\xE2\x96\x81T", "!", "\xE2\x96\x81" "7"}) {
    EXPECT_TRUE(all.count(piece)) << piece;
  }
  EXPECT_EQ(synth_vocabulary(32000).tokens, v.tokens);
  const Vocabulary small = synth_vocabulary(300);
  EXPECT_EQ(small.tokens.size(), 300u);
  EXPECT_TRUE(std::equal(small.tokens.begin(), small.tokens.end(), v.tokens.begin())) << "a prefix of the large one";
}

TEST(Synth, TokenizerRoundTripsArbitraryTextOnTheSyntheticVocabulary) {
  for (int64_t size : {260, 512, 32000}) {
    SCOPED_TRACE(size);
    const auto tok = Tokenizer::create(synth_vocabulary(size));
    const std::vector<std::string> texts = {
        "Once upon a time, there was a little girl named Lily.",
        "  two leading spaces, trailing  ",
        "tabs\tand\nnewlines\r\n",
        "Unicode: h\xC3\xA9llo w\xC3\xB6rld \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x99\x82",
        "punctuation!?.,;:'\"()[]{}<>@#$%^&*-_=+/\\|~`",
        "digits 0123456789 and CAPS XYZ",
        "x",
        "",
    };
    for (const auto& text : texts) {
      const auto ids = tok->encode(text, true);
      ASSERT_FALSE(ids.empty());
      EXPECT_EQ(ids[0], 1);
      EXPECT_EQ(tok->decode(ids), text);
    }
  }
  const auto tok = Tokenizer::create(synth_vocabulary(32000));
  const auto ids = tok->encode("the cat sat on the mat", false);
  EXPECT_LE(ids.size(), 8u) << "common words take few pieces";
}

// ---------------------------------------------------------------- models through the pipeline

std::vector<int32_t> greedy(Pipeline& p, const std::vector<int32_t>& prompt, int64_t n) {
  Engine engine(p);
  GenerationRequest req;
  req.prompt = prompt;
  req.max_tokens = n;
  req.ignore_eos = true;
  req.sampling = SamplingParams{};
  engine.submit(std::move(req));
  engine.run_until_idle();
  auto results = engine.take_finished();
  EXPECT_EQ(results.size(), 1u);
  return results.empty() ? std::vector<int32_t>{} : results[0].tokens;
}

// Logits of every position of `tokens` in one forward pass.
std::vector<float> all_logits(Pipeline& p, const std::vector<int32_t>& tokens) {
  const SeqId seq = 12345;
  CacheRequest req;
  req.seq = seq;
  req.total_tokens = static_cast<int64_t>(tokens.size());
  req.tokens = tokens;
  req.retain = false;
  auto plan = p.cache().plan(std::span<const CacheRequest>(&req, 1));
  EXPECT_TRUE(plan.has_value());
  if (!plan) return {};
  p.cache().commit(*plan);
  ForwardSeq fs{seq, tokens, 0, static_cast<int64_t>(tokens.size())};
  std::vector<float> logits;
  p.model().forward(std::span<const ForwardSeq>(&fs, 1), p.attention(), p.cache(), logits);
  p.cache().release(seq);
  return logits;
}

// Loads the model, checks its configuration against the spec, and generates: the tokens must vary
// and every logit of the generated sequence must be finite and spread out.
void expect_healthy_model(const SynthSpec& spec, const std::string& path) {
  const auto file = GgufFile::open(path);
  const ModelConfig c = read_model_config(*file);
  EXPECT_EQ(c.architecture, "llama");
  EXPECT_EQ(c.dim, spec.dim);
  EXPECT_EQ(c.ffn_dim, spec.ffn_dim);
  EXPECT_EQ(c.n_layers, spec.n_layers);
  EXPECT_EQ(c.n_heads, spec.n_heads);
  EXPECT_EQ(c.n_kv_heads, spec.n_kv_heads);
  EXPECT_EQ(c.vocab, spec.vocab);
  EXPECT_EQ(c.context_length, spec.context_length);
  EXPECT_EQ(c.head_dim, spec.dim / spec.n_heads);
  EXPECT_EQ(c.rope_dim, c.head_dim);
  EXPECT_FLOAT_EQ(c.rope_theta, static_cast<float>(spec.rope_theta));
  EXPECT_FLOAT_EQ(c.rms_eps, static_cast<float>(spec.rms_eps));
  EXPECT_EQ(c.tied_output, spec.tied_output);
  EXPECT_EQ(file->get_int("llama.vocab_size"), spec.vocab);

  auto p = test::cpu_pipeline(path);
  const Tokenizer& tok = p->tokenizer();
  EXPECT_EQ(tok.vocab_size(), spec.vocab);
  const auto prompt = tok.encode("Once upon a time", true);
  const auto out = greedy(*p, prompt, 50);
  ASSERT_EQ(out.size(), 50u);
  const std::set<int32_t> distinct(out.begin(), out.end());
  EXPECT_GE(distinct.size(), 5u) << "greedy tokens: " << ::testing::PrintToString(out);

  std::vector<int32_t> all = prompt;
  all.insert(all.end(), out.begin(), out.end());
  const std::vector<float> logits = all_logits(*p, all);
  ASSERT_EQ(logits.size(), all.size() * static_cast<size_t>(spec.vocab));
  for (size_t row = 0; row < all.size(); ++row) {
    const float* l = logits.data() + row * static_cast<size_t>(spec.vocab);
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < spec.vocab; ++i) {
      ASSERT_TRUE(std::isfinite(l[i])) << "row " << row << " logit " << i;
      sum += l[i];
      sq += double(l[i]) * l[i];
    }
    const double mean = sum / double(spec.vocab), sd = std::sqrt(sq / double(spec.vocab) - mean * mean);
    EXPECT_GT(sd, 0.1) << "row " << row;
    EXPECT_LT(sd, 100) << "row " << row;
  }
}

class SynthDtype : public ::testing::TestWithParam<DType> {};

TEST_P(SynthDtype, TinyPresetLoadsAndGenerates) {
  TempDir dir;
  SynthSpec spec = synth_preset("tiny");
  spec.dtype = GetParam();
  spec.seed = 7;
  if (dtype_block_elems(spec.dtype) == 256) {  // k-quants: rows of whole super-blocks, ffn_down too
    spec.dim = 256;
    spec.ffn_dim = 512;
  }
  const std::string path = dir.file("tiny.gguf");
  write_synthetic_model(spec, path);
  const auto f = GgufFile::open(path);
  const int64_t ftype = f->get_int("general.file_type");
  switch (spec.dtype) {
    case DType::F32: EXPECT_EQ(ftype, 0); break;
    case DType::F16: EXPECT_EQ(ftype, 1); break;
    case DType::Q4_0: EXPECT_EQ(ftype, 2); break;
    case DType::Q8_0: EXPECT_EQ(ftype, 7); break;
    case DType::Q4_K: EXPECT_EQ(ftype, 14); break;
    case DType::Q6_K: EXPECT_EQ(ftype, 18); break;
    case DType::BF16: EXPECT_EQ(ftype, 32); break;
    default: FAIL();
  }
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->get_string("general.architecture"), "llama");
  EXPECT_EQ(f->get_string("general.name"), "tessera-synth-tiny");
  EXPECT_EQ(f->get_string("tokenizer.ggml.model"), "llama");
  EXPECT_EQ(f->get_int("tokenizer.ggml.bos_token_id"), 1);
  EXPECT_EQ(f->get_int("tokenizer.ggml.eos_token_id"), 2);
  EXPECT_EQ(f->get_int("tokenizer.ggml.unknown_token_id"), 0);
  EXPECT_TRUE(f->get_bool("tokenizer.ggml.add_bos_token", false));
  EXPECT_EQ(f->get_string_array("tokenizer.ggml.tokens"), synth_vocabulary(512).tokens);
  EXPECT_EQ(f->find("tokenizer.ggml.token_type")->elem_type, GgufType::INT32);
  EXPECT_EQ(f->find("tokenizer.ggml.scores")->elem_type, GgufType::FLOAT32);
  EXPECT_EQ(f->tensors().size(), 3u + 9u * 2u);
  for (const GgufTensor& t : f->tensors()) {
    SCOPED_TRACE(t.name);
    EXPECT_EQ(t.offset % 32, 0u);
    if (t.shape.size() == 1) {
      EXPECT_EQ(t.dtype, DType::F32);  // norms
    } else if (t.shape[0] % dtype_block_elems(spec.dtype) != 0) {
      EXPECT_EQ(t.dtype, DType::F32);  // ffn_down: rows of 172
      EXPECT_NE(t.name.find("ffn_down"), std::string::npos);
    } else {
      EXPECT_EQ(t.dtype, spec.dtype);
    }
  }
  expect_healthy_model(spec, path);
}

INSTANTIATE_TEST_SUITE_P(AllTypes, SynthDtype,
                         ::testing::Values(DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0,
                                           DType::Q4_K, DType::Q6_K),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(Synth, OverridesShapeTheModel) {
  TempDir dir;
  SynthSpec spec = synth_preset("tiny");
  spec.n_layers = 3;
  spec.n_kv_heads = 1;
  spec.ffn_dim = 128;
  spec.vocab = 700;
  spec.context_length = 128;
  spec.rope_theta = 500000;
  spec.rms_eps = 1e-6;
  spec.dtype = DType::Q8_0;
  write_synthetic_model(spec, dir.file("m.gguf"));
  const auto f = GgufFile::open(dir.file("m.gguf"));
  EXPECT_EQ(f->find_tensor("blk.2.attn_k.weight")->shape, (std::vector<int64_t>{64, 16}));
  EXPECT_EQ(f->find_tensor("blk.2.ffn_down.weight")->dtype, DType::Q8_0);
  EXPECT_EQ(f->find_tensor("token_embd.weight")->shape, (std::vector<int64_t>{64, 700}));
  expect_healthy_model(spec, dir.file("m.gguf"));

  spec = synth_preset("tiny");
  spec.tied_output = true;
  write_synthetic_model(spec, dir.file("tied.gguf"));
  EXPECT_EQ(GgufFile::open(dir.file("tied.gguf"))->find_tensor("output.weight"), nullptr);
  expect_healthy_model(spec, dir.file("tied.gguf"));
}

TEST(Synth, TheSeedDecidesTheWeights) {
  TempDir dir;
  SynthSpec spec = synth_preset("tiny");
  write_synthetic_model(spec, dir.file("a.gguf"));
  write_synthetic_model(spec, dir.file("b.gguf"));
  spec.seed = 1;
  write_synthetic_model(spec, dir.file("c.gguf"));
  const std::string a = test::read_text(dir.file("a.gguf"));
  EXPECT_EQ(a, test::read_text(dir.file("b.gguf")));
  EXPECT_NE(a, test::read_text(dir.file("c.gguf")));
  EXPECT_EQ(a.size(), test::read_text(dir.file("c.gguf")).size());
  // A layer's weights do not depend on how many layers follow it.
  spec.seed = 0;
  spec.n_layers = 3;
  write_synthetic_model(spec, dir.file("d.gguf"));
  const auto fa = GgufFile::open(dir.file("a.gguf"));
  const auto fd = GgufFile::open(dir.file("d.gguf"));
  const GgufTensor* ta = fa->find_tensor("blk.1.ffn_up.weight");
  const GgufTensor* td = fd->find_tensor("blk.1.ffn_up.weight");
  ASSERT_TRUE(ta && td);
  EXPECT_EQ(std::memcmp(ta->data, td->data, ta->nbytes), 0);
}

TEST(Synth, WeightsHaveTheIntendedScale) {
  TempDir dir;
  const SynthSpec spec = synth_preset("tiny");
  write_synthetic_model(spec, dir.file("m.gguf"));
  const auto f = GgufFile::open(dir.file("m.gguf"));
  const GgufTensor* t = f->find_tensor("blk.0.ffn_gate.weight");
  const auto* w = static_cast<const float*>(t->data);
  double sum = 0, sq = 0;
  const int64_t n = t->elements();
  for (int64_t i = 0; i < n; ++i) {
    sum += w[i];
    sq += double(w[i]) * w[i];
  }
  EXPECT_NEAR(sum / double(n), 0.0, 0.01);
  EXPECT_NEAR(std::sqrt(sq / double(n)), 1.0 / std::sqrt(64.0), 0.01);
  const auto* norm = static_cast<const float*>(f->find_tensor("blk.0.attn_norm.weight")->data);
  EXPECT_EQ(norm[0], 1.0f);
}

// ---------------------------------------------------------------- the command

using test::Output;
using test::tessera_cmd;

TEST(SynthCommand, WritesAModelAndPrintsASummary) {
  TempDir dir;
  const std::string path = dir.file("m.gguf");
  const Output o = tessera_cmd("synth --preset tiny --layers 3 --kv-heads 1 --dtype q8_0 --seed 3 -o '" + path + "'");
  ASSERT_EQ(o.status, 0) << o.text;
  EXPECT_THAT(o.text, HasSubstr("3 layers"));
  EXPECT_THAT(o.text, HasSubstr("4/1 heads"));
  EXPECT_THAT(o.text, HasSubstr("parameters"));
  EXPECT_THAT(o.text, HasSubstr("q8_0"));
  const auto f = GgufFile::open(path);
  EXPECT_EQ(f->get_int("llama.block_count"), 3);
  EXPECT_EQ(f->get_int("llama.attention.head_count_kv"), 1);
  EXPECT_EQ(f->get_int("general.file_type"), 7);

  const Output heads = tessera_cmd("synth --preset tiny --heads 8 -o '" + dir.file("h.gguf") + "'");
  EXPECT_EQ(heads.status, 0) << "kv heads 2 divide 8: " << heads.text;
  const Output bad = tessera_cmd("synth --preset tiny --heads 3 -o '" + dir.file("x.gguf") + "'");
  EXPECT_NE(bad.status, 0);
  EXPECT_THAT(bad.text, HasSubstr("heads = 3 does not divide dim = 64"));
  const Output unknown = tessera_cmd("synth --preset huge -o '" + dir.file("x.gguf") + "'");
  EXPECT_NE(unknown.status, 0);
  EXPECT_THAT(unknown.text, HasSubstr("presets: tiny, 110m, 110m-gqa, 1b"));
  const Output dtype = tessera_cmd("synth --preset tiny --dtype iq1_s -o '" + dir.file("x.gguf") + "'");
  EXPECT_NE(dtype.status, 0);
  EXPECT_THAT(dtype.text, HasSubstr("--dtype 'iq1_s' is not supported"));
  EXPECT_FALSE(fs::exists(dir.file("x.gguf")));
}

}  // namespace
}  // namespace tessera
