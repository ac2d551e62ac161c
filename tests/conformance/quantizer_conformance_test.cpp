// Quantizer conformance: every quantizer the loader finds, with its defaults, turns seeded random
// weights (f32, f16 and q8_0 sources; odd row counts) into a Linear on the CPU backend whose
// forward() stays close to x·Wᵀ computed here in double, with a bound set by the format it chose.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "conformance/conformance_util.h"
#include "tessera/error.h"

namespace tessera {
namespace {

using namespace conformance;

// Allowed normalised RMS error of y (||y - y_ref|| / ||y_ref||), from the format the Linear reports.
// For random weights the relative error of y tracks the relative RMS error of the stored weights:
//  - f32: only the summation order differs (~1e-7); 1e-5 leaves room for blocked/FMA kernels.
//  - f16 / bf16: weights rounded to 11 / 8 mantissa bits (RMS ~2e-4 / ~1.6e-3), maybe activations too.
//  - 8-bit formats (q8_0, int8/channel, ...): step amax/127, RMS ~0.3% of the weight, plus 8-bit
//    dynamic activations in int8 kernels: well under 2%.
//  - anything coarser (q4_0, int4/group, k-quants): step ~amax/8 on uniform weights gives ~6.5%;
//    0.12 leaves room for group and zero-point variants while a wrong scale, nibble order or group
//    mapping gives errors of order 1.
double tolerance_for(const std::string& format) {
  if (format == "f32") return 1e-5;
  if (format == "f16") return 1e-3;
  if (format == "bf16") return 8e-3;
  if (format.find('8') != std::string::npos) return 0.02;
  return 0.12;
}

void put_u16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }

// The weight as the model file stores it, plus the float values it means.
struct Source {
  DType dtype;
  std::vector<uint8_t> bytes;
  std::vector<float> values;  // dequantized: the matrix the Linear should multiply by
};

Source make_source(DType t, int64_t rows, int64_t cols, uint64_t seed) {
  // Rows of different magnitude, as real layers have, so per-row (per-channel) scales matter.
  auto w = random_floats(size_t(rows * cols), seed);
  const auto row_scale = random_floats(size_t(rows), seed + 1, 0.5f, 2.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) w[size_t(r * cols + c)] *= row_scale[size_t(r)];
  }
  Source s{t, std::vector<uint8_t>(dtype_row_bytes(t, cols) * size_t(rows)), std::vector<float>(w.size())};
  uint8_t* out = s.bytes.data();
  if (t == DType::F32) {
    std::memcpy(out, w.data(), s.bytes.size());
  } else if (t == DType::F16) {
    for (size_t i = 0; i < w.size(); ++i) put_u16(out + 2 * i, f32_to_fp16(w[i]));
  } else if (t == DType::Q8_0) {
    for (size_t b = 0; b < w.size() / 32; ++b) {  // ggml q8_0: scale amax/127 per block of 32
      const float* x = w.data() + b * 32;
      uint8_t* blk = out + b * 34;
      float amax = 0;
      for (int i = 0; i < 32; ++i) amax = std::max(amax, std::abs(x[i]));
      const float d = amax / 127.0f;
      put_u16(blk, f32_to_fp16(d));
      for (int i = 0; i < 32; ++i) blk[2 + i] = uint8_t(int8_t(std::lround(d != 0 ? x[i] / d : 0.0f)));
    }
  }
  const size_t row_bytes = dtype_row_bytes(t, cols);
  for (int64_t r = 0; r < rows; ++r) dequantize_row(t, out + size_t(r) * row_bytes, s.values.data() + r * cols, cols);
  return s;
}

class QuantizerConformance : public testing::TestWithParam<std::string> {};

// Every property of the Linears one quantizer makes, over sources, shapes and activations.
void check_linears(Quantizer& q) {
  Backend& b = cpu();
  for (DType src : {DType::F32, DType::F16, DType::Q8_0}) {
    for (int64_t cols : {64, 96, 256}) {
      for (int64_t rows : {1, 7, 33}) {
        const std::string what = std::string(dtype_name(src)) + " " + std::to_string(rows) + "x" + std::to_string(cols);
        SCOPED_TRACE(what);
        const uint64_t seed = uint64_t(src) * 100000 + uint64_t(rows * 1000 + cols);
        const Source s = make_source(src, rows, cols, seed);
        const WeightSource ws{"blk.0.ffn_up.weight", src, s.bytes.data(), rows, cols};
        std::unique_ptr<Linear> linear;
        try {
          linear = q.make_linear(b, ws);
        } catch (const Error& e) {
          ADD_FAILURE() << "make_linear refused on the cpu backend, which implements every op: " << e.what();
          continue;
        }
        ASSERT_NE(linear, nullptr);
        EXPECT_EQ(linear->in_features(), cols);
        EXPECT_EQ(linear->out_features(), rows);
        const std::string format = linear->format();
        EXPECT_FALSE(format.empty());
        const WeightView view = linear->view();
        EXPECT_NE(view.data, nullptr);
        EXPECT_EQ(view.rows, rows);
        EXPECT_EQ(view.cols, cols);
        // Resident memory is real and no bigger than an f32 copy plus modest scale/zero overhead.
        const size_t f32_bytes = size_t(4 * rows * cols);
        EXPECT_GT(linear->resident_bytes(), 0u);
        EXPECT_LE(linear->resident_bytes(), f32_bytes + size_t(8 * rows) * size_t(cols / 32 + 1) + 4096)
            << "format " << format;

        // y for several activation rows, against double-precision x·Wᵀ of what the file says.
        const int64_t m = 19;  // whole tiles of every kernel (4, 6, 8, 16 rows) and a part of one
        const auto x = random_floats(size_t(m * cols), seed + 7, -2, 2);
        std::vector<double> want(size_t(m * rows));
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < rows; ++j) {
            double acc = 0;
            for (int64_t k = 0; k < cols; ++k) acc += double(x[size_t(i * cols + k)]) * s.values[size_t(j * cols + k)];
            want[size_t(i * rows + j)] = acc;
          }
        }
        DeviceBuffer xb = upload(b, x);
        DeviceBuffer yb = poisoned_floats(b, want.size() + 16);
        linear->forward(xb.as<float>(), m, yb.as<float>());
        b.synchronize();
        auto y = download<float>(b, yb.get(), want.size() + 16);
        EXPECT_TRUE(all_nan(std::span<const float>(y).subspan(want.size()))) << "forward wrote past y";
        y.resize(want.size());
        // RMS error relative to the typical size of a product term sum, sqrt(mean ‖x_i‖²‖w_j‖² / k):
        // unlike ‖y‖ it cannot shrink towards zero when a few outputs happen to cancel (one-row
        // weights), so the bound measures the format, not the luck of the draw.
        double scale = 0, sq_err = 0;
        for (int64_t i = 0; i < m; ++i) {
          double xx = 0;
          for (int64_t k = 0; k < cols; ++k) xx += double(x[size_t(i * cols + k)]) * x[size_t(i * cols + k)];
          for (int64_t j = 0; j < rows; ++j) {
            double ww = 0;
            for (int64_t k = 0; k < cols; ++k) ww += s.values[size_t(j * cols + k)] * s.values[size_t(j * cols + k)];
            scale += xx * ww / double(cols);
            const double d = double(y[size_t(i * rows + j)]) - want[size_t(i * rows + j)];
            sq_err += d * d;
          }
        }
        const double err = std::isnan(sq_err) ? INFINITY : std::sqrt(sq_err / std::max(scale, 1e-300));
        EXPECT_LT(err, tolerance_for(format)) << "format " << format;

        // A single row (decode) gives the same answer as that row inside a batch.
        DeviceBuffer y1 = poisoned_floats(b, size_t(rows));
        linear->forward(xb.as<float>() + 2 * cols, 1, y1.as<float>());
        const auto row2 = download<float>(b, y1.get(), size_t(rows));
        // Against the batched row, not the float reference: one output of one row can cancel
        // almost to zero, so a relative error on it says nothing about the format's accuracy
        // (checked above over the batch). Per-token schemes must not depend on the other rows.
        const std::vector<double> batched(y.begin() + 2 * rows, y.begin() + 3 * rows);
        EXPECT_LT(normalized_rms_error(row2, batched), 1e-5) << "m=1 differs from the batch, format " << format;
      }
    }
  }
}

TEST(QuantizerPlugins, AtLeastOneIsLoaded) {
  EXPECT_FALSE(plugin_names(ComponentKind::quantizer).empty())
      << "no quantizer plugin in " << plugin_source() << "\n" << load_failures();
}

// One plugin with one parameter set: its defaults, then each declared choice (e.g. the target dtype,
// a kernel) so every format and kernel is reached, each its own test so that a kernel this CPU
// cannot run is skipped by name while the others run.
struct QuantizerVariant {
  std::string plugin;
  Variant variant;
};

void PrintTo(const QuantizerVariant& v, std::ostream* os) { *os << v.plugin << " " << v.variant.label; }

std::vector<QuantizerVariant> quantizer_variants() {
  std::vector<QuantizerVariant> out;
  for (const std::string& name : plugin_names(ComponentKind::quantizer)) {
    for (Variant& v : choice_variants(ComponentKind::quantizer, name)) out.push_back({name, std::move(v)});
  }
  return out;
}

class QuantizerVariantConformance : public testing::TestWithParam<QuantizerVariant> {
 protected:
  void SetUp() override {
    const std::string missing = missing_cpu_isa(GetParam().variant);
    if (!missing.empty()) GTEST_SKIP() << GetParam().plugin << " " << GetParam().variant.label << ": " << missing;
  }
  std::shared_ptr<Quantizer> make() const {
    return registry().create<Quantizer>(GetParam().plugin, GetParam().variant.params, "conformance test");
  }
};

TEST_P(QuantizerVariantConformance, LinearComputesXTimesWTransposed) {
  auto quantizer = make();
  ASSERT_NE(quantizer, nullptr);
  check_linears(*quantizer);
}

TEST_P(QuantizerConformance, LinearsAreIndependent) {
  // Two weights made by one quantizer must not share storage: the second must not change the first.
  auto quantizer = create_default<Quantizer>(GetParam());
  Backend& b = cpu();
  const int64_t rows = 9, cols = 64;
  const Source s1 = make_source(DType::F32, rows, cols, 31), s2 = make_source(DType::F32, rows, cols, 32);
  auto l1 = quantizer->make_linear(b, {"blk.0.attn_q.weight", DType::F32, s1.bytes.data(), rows, cols});
  const auto x = random_floats(size_t(cols), 33);
  DeviceBuffer xb = upload(b, x);
  DeviceBuffer ya = poisoned_floats(b, size_t(rows)), yb = poisoned_floats(b, size_t(rows));
  l1->forward(xb.as<float>(), 1, ya.as<float>());
  const auto before = download<float>(b, ya.get(), size_t(rows));
  auto l2 = quantizer->make_linear(b, {"blk.0.attn_k.weight", DType::F32, s2.bytes.data(), rows, cols});
  l2->forward(xb.as<float>(), 1, yb.as<float>());
  l1->forward(xb.as<float>(), 1, ya.as<float>());
  EXPECT_EQ(download<float>(b, ya.get(), size_t(rows)), before);
  EXPECT_NE(download<float>(b, yb.get(), size_t(rows)), before);
}

TEST_P(QuantizerVariantConformance, AFusedLinearGivesItsPartsResultsOrIsDeclined) {
  // A layer's q, k and v as the model asks for them: one Linear whose outputs are the parts' side
  // by side, each as the part's own Linear computes it (row counts are whole 16-row tiles, as in
  // real models, so no kernel puts a row in a different tile), or null, and then the model keeps
  // the parts apart. Parts of different types are never joined.
  Backend& b = cpu();
  const int64_t cols = 64;
  const std::vector<std::pair<std::string, int64_t>> shapes = {
      {"blk.1.attn_q.weight", 48}, {"blk.1.attn_k.weight", 16}, {"blk.1.attn_v.weight", 16}};
  for (DType src : {DType::F32, DType::F16, DType::Q8_0}) {
    SCOPED_TRACE(dtype_name(src));
    {
      auto quantizer = make();
      std::vector<Source> sources;
      std::vector<WeightSource> parts;
      for (size_t i = 0; i < shapes.size(); ++i) sources.push_back(make_source(src, shapes[i].second, cols, 50 + i));
      for (size_t i = 0; i < shapes.size(); ++i) {
        parts.push_back({shapes[i].first, src, sources[i].bytes.data(), shapes[i].second, cols});
      }
      std::unique_ptr<Linear> fused = quantizer->make_fused_linear(b, parts);
      if (fused == nullptr) continue;
      ASSERT_EQ(fused->out_features(), 80);
      ASSERT_EQ(fused->in_features(), cols);
      const int64_t m = 3;
      const auto x = random_floats(size_t(m * cols), 60, -2, 2);
      DeviceBuffer xb = upload(b, x);
      DeviceBuffer yb = poisoned_floats(b, size_t(m * 80));
      fused->forward(xb.as<float>(), m, yb.as<float>());
      const auto y = download<float>(b, yb.get(), size_t(m * 80));
      int64_t at = 0;
      size_t bytes = 0;
      for (const WeightSource& part : parts) {
        auto alone = quantizer->make_linear(b, part);
        EXPECT_EQ(alone->format(), fused->format()) << part.name;
        bytes += alone->resident_bytes();
        DeviceBuffer ya = poisoned_floats(b, size_t(m * part.rows));
        alone->forward(xb.as<float>(), m, ya.as<float>());
        const auto want = download<float>(b, ya.get(), size_t(m * part.rows));
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < part.rows; ++j) {
            ASSERT_EQ(y[size_t(i * 80 + at + j)], want[size_t(i * part.rows + j)])
                << part.name << " row " << j << " of x row " << i;
          }
        }
        at += part.rows;
      }
      EXPECT_EQ(fused->resident_bytes(), bytes) << "the fused weight is the parts' storage, no more";
    }
  }
  auto quantizer = make();
  const Source a = make_source(DType::F32, 16, cols, 70), c = make_source(DType::F16, 16, cols, 71);
  const std::vector<WeightSource> mixed = {{"blk.0.ffn_gate.weight", DType::F32, a.bytes.data(), 16, cols},
                                           {"blk.0.ffn_up.weight", DType::F16, c.bytes.data(), 16, cols}};
  EXPECT_EQ(quantizer->make_fused_linear(b, mixed), nullptr) << "f32 and f16 parts joined";
}

INSTANTIATE_TEST_SUITE_P(Quantizers, QuantizerConformance,
                         testing::ValuesIn(plugin_names(ComponentKind::quantizer)), param_name);
INSTANTIATE_TEST_SUITE_P(Quantizers, QuantizerVariantConformance, testing::ValuesIn(quantizer_variants()),
                         [](const testing::TestParamInfo<QuantizerVariant>& info) {
                           return param_name({info.param.plugin + "_" + info.param.variant.label, info.index});
                         });

}  // namespace
}  // namespace tessera
