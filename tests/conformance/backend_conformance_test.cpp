// Backend conformance: every backend the loader finds runs every op it claims in supports() against
// a naive reference written here (plain loops, double accumulation) on seeded random data with odd
// sizes. Outputs are NaN-poisoned before each run and followed by a poisoned guard region, so an
// output the kernel skipped or a write past the end fails. A backend without a device on this
// machine (cuda/hip) is skipped with its refusal; the cpu backend always runs and must claim every op.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "conformance/backend_conformance.h"
#include "conformance/conformance_util.h"
#include "tessera/error.h"

namespace tessera {
namespace {

using namespace conformance;

// ---- weight encoding (test-side, so the reference never trusts the code under test) ------------

void put_u16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }

// ggml's reference quantizers: q8_0 scales a block of 32 by amax/127; q4_0 maps the signed value of
// largest magnitude to -8 and stores x/d + 8 in nibbles (element j low, element j+16 high).
std::vector<uint8_t> encode(DType t, const std::vector<float>& w, int64_t rows, int64_t cols) {
  const size_t row_bytes = dtype_row_bytes(t, cols);
  std::vector<uint8_t> out(row_bytes * size_t(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = w.data() + r * cols;
    uint8_t* dst = out.data() + size_t(r) * row_bytes;
    switch (t) {
      case DType::F32: std::memcpy(dst, src, row_bytes); break;
      case DType::F16:
        for (int64_t i = 0; i < cols; ++i) put_u16(dst + 2 * i, f32_to_fp16(src[i]));
        break;
      case DType::BF16:
        for (int64_t i = 0; i < cols; ++i) put_u16(dst + 2 * i, f32_to_bf16(src[i]));
        break;
      case DType::Q8_0:
        for (int64_t b = 0; b < cols / 32; ++b) {
          const float* x = src + b * 32;
          uint8_t* blk = dst + b * 34;
          float amax = 0;
          for (int i = 0; i < 32; ++i) amax = std::max(amax, std::abs(x[i]));
          const float d = amax / 127.0f;
          const float id = d != 0 ? 1.0f / d : 0.0f;
          put_u16(blk, f32_to_fp16(d));
          for (int i = 0; i < 32; ++i) blk[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(std::lround(x[i] * id)));
        }
        break;
      case DType::Q4_0:
        for (int64_t b = 0; b < cols / 32; ++b) {
          const float* x = src + b * 32;
          uint8_t* blk = dst + b * 18;
          float max = 0, amax = 0;
          for (int i = 0; i < 32; ++i) {
            if (std::abs(x[i]) > amax) {
              amax = std::abs(x[i]);
              max = x[i];
            }
          }
          const float d = max / -8.0f;
          const float id = d != 0 ? 1.0f / d : 0.0f;
          put_u16(blk, f32_to_fp16(d));
          for (int i = 0; i < 16; ++i) {
            const int lo = std::min(15, int(x[i] * id + 8.5f));
            const int hi = std::min(15, int(x[i + 16] * id + 8.5f));
            blk[2 + i] = static_cast<uint8_t>(lo | (hi << 4));
          }
        }
        break;
      default: throw Error("test cannot encode " + std::string(dtype_name(t)));
    }
  }
  return out;
}

// The other GGUF block formats (blocks of 32 with a min or a fifth bit, the k-quants, IQ4_NL/IQ4_XS,
// the IQ2/IQ3 grid formats, whose every index is in range of its codebook),
// written here as raw blocks: every bit pattern a file may hold, so every field of the layout is
// exercised. Bytes are drawn from the floats' bits; each block's fp16 scale (and min or min scale)
// is set to 1/64 so that the weights stay small and finite.
std::vector<int> fp16_scale_offsets(DType t) {
  switch (t) {
    case DType::Q4_1:
    case DType::Q5_1:
    case DType::Q4_K:
    case DType::Q5_K: return {0, 2};
    case DType::Q5_0:
    case DType::IQ4_NL:
    case DType::IQ4_XS:
    case DType::IQ2_XXS:
    case DType::IQ2_XS:
    case DType::IQ2_S:
    case DType::IQ3_XXS:
    case DType::IQ3_S: return {0};
    case DType::Q2_K: return {80, 82};
    case DType::Q3_K: return {108};
    case DType::Q6_K: return {208};
    default: throw Error("test has no raw blocks of " + std::string(dtype_name(t)));
  }
}

std::vector<uint8_t> raw_blocks(DType t, const std::vector<float>& w, int64_t rows, int64_t cols) {
  std::vector<uint8_t> out(dtype_row_bytes(t, cols) * size_t(rows));
  for (size_t i = 0; i < out.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &w[i % w.size()], 4);
    out[i] = static_cast<uint8_t>((bits >> 7) ^ (bits >> 15) ^ uint32_t(i * 131));
  }
  const uint16_t d = f32_to_fp16(1.0f / 64);
  for (size_t at = 0; at < out.size(); at += dtype_block_bytes(t)) {
    for (int off : fp16_scale_offsets(t)) put_u16(&out[at + size_t(off)], d);
  }
  return out;
}

// Formats encoded by raw_blocks rather than encode().
constexpr DType kRawBlockTypes[] = {DType::Q4_1,   DType::Q5_0,    DType::Q5_1,   DType::IQ4_NL,  DType::Q2_K,
                                    DType::Q3_K,   DType::Q4_K,    DType::Q5_K,   DType::Q6_K,    DType::IQ4_XS,
                                    DType::IQ2_XXS, DType::IQ2_XS, DType::IQ2_S,  DType::IQ3_XXS, DType::IQ3_S};
bool raw_block_type(DType t) { return std::find(std::begin(kRawBlockTypes), std::end(kRawBlockTypes), t) != std::end(kRawBlockTypes); }

// fp16 scales per block of a raw-block type (2: a scale and a min or min scale), else 0.
size_t fp16_scales_per_block(DType t) { return raw_block_type(t) ? fp16_scale_offsets(t).size() : 0; }

// Encodes w as t: encode() for float, Q8_0 and Q4_0, raw_blocks() otherwise.
std::vector<uint8_t> encode_any(DType t, const std::vector<float>& w, int64_t rows, int64_t cols) {
  return raw_block_type(t) ? raw_blocks(t, w, rows, cols) : encode(t, w, rows, cols);
}

std::vector<float> dequantize(DType t, const std::vector<uint8_t>& data, int64_t rows, int64_t cols) {
  std::vector<float> out(size_t(rows * cols));
  const size_t row_bytes = dtype_row_bytes(t, cols);
  for (int64_t r = 0; r < rows; ++r) {
    dequantize_row(t, data.data() + size_t(r) * row_bytes, out.data() + r * cols, cols);
  }
  return out;
}


TEST(BackendPlugins, EveryLibraryInThePluginDirectoryLoads) { EXPECT_EQ(load_failures(), ""); }

TEST(BackendPlugins, AtLeastTheCpuBackendIsLoaded) {
  const auto names = plugin_names(ComponentKind::backend);
  ASSERT_FALSE(names.empty()) << "no backend plugin in " << plugin_source() << "\n" << load_failures();
  EXPECT_NE(std::find(names.begin(), names.end(), "cpu"), names.end());
}

TEST_P(BackendConformance, DescribesItself) {
  EXPECT_EQ(b().name(), GetParam());
  const auto devices = b().devices();
  ASSERT_FALSE(devices.empty());
  EXPECT_FALSE(devices[0].name.empty());
}

// ---- memory ---------------------------------------------------------------------------------------

TEST_P(BackendConformance, MemoryRoundTripsCopiesAndZeroes) {
  for (size_t bytes : {size_t(1), size_t(3), size_t(64), size_t(4097)}) {
    SCOPED_TRACE(std::to_string(bytes) + " bytes");
    std::vector<uint8_t> host(bytes);
    const auto r = random_ints(bytes, 11 + bytes, 0, 255);
    for (size_t i = 0; i < bytes; ++i) host[i] = uint8_t(r[i]);

    DeviceBuffer a(b(), bytes), c(b(), bytes);
    b().copy_to_device(a.get(), host.data(), bytes);
    EXPECT_EQ(download<uint8_t>(b(), a.get(), bytes), host);

    b().copy_on_device(c.get(), a.get(), bytes);
    b().synchronize();
    EXPECT_EQ(download<uint8_t>(b(), c.get(), bytes), host);

    // Zeroing a sub-range leaves the bytes around it alone.
    if (bytes >= 3) {
      b().fill_zero(static_cast<uint8_t*>(c.get()) + 1, bytes - 2);
      std::vector<uint8_t> want = host;
      std::fill(want.begin() + 1, want.end() - 1, 0);
      EXPECT_EQ(download<uint8_t>(b(), c.get(), bytes), want);
      // Copy into an offset: the rest of the destination keeps its contents.
      b().copy_on_device(static_cast<uint8_t*>(c.get()) + 1, a.get(), bytes - 2);
      std::copy(host.begin(), host.end() - 2, want.begin() + 1);
      EXPECT_EQ(download<uint8_t>(b(), c.get(), bytes), want);
    }
    b().fill_zero(a.get(), bytes);
    EXPECT_EQ(download<uint8_t>(b(), a.get(), bytes), std::vector<uint8_t>(bytes, 0));
  }
}

TEST_P(BackendConformance, CopyRowsMovesAColumnRangeOfEveryRow) {
  // What the model does with a fused q|k|v output of 5 tokens: take k (columns 12..19 of 28 floats)
  // into its own 8-float rows, leaving everything else in the destination alone.
  const int64_t rows = 5, width = 28, from = 12, cols = 8;
  std::vector<float> src(size_t(rows * width));
  for (size_t i = 0; i < src.size(); ++i) src[i] = float(i);
  DeviceBuffer a = upload(b(), src);
  DeviceBuffer c = poisoned_floats(b(), size_t(rows * cols + 3));
  b().copy_rows(c.as<float>(), size_t(cols) * 4, a.as<float>() + from, size_t(width) * 4, size_t(cols) * 4, rows);
  b().synchronize();
  const auto got = download<float>(b(), c.get(), size_t(rows * cols + 3));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < cols; ++j) {
      EXPECT_EQ(got[size_t(r * cols + j)], src[size_t(r * width + from + j)]) << r << "," << j;
    }
  }
  EXPECT_TRUE(all_nan(std::span<const float>(got).subspan(size_t(rows * cols)))) << "copy_rows wrote past the rows";
  b().copy_rows(c.as<float>(), size_t(cols) * 4, a.as<float>(), size_t(width) * 4, size_t(cols) * 4, 0);  // nothing
}

// ---- gemm -----------------------------------------------------------------------------------------

// Error allowed per output, relative to sum_i |x_i * w_i| (so cancellation cannot make a correct
// kernel fail). f32: float accumulation over <= 160 terms (k * 2^-24 ~ 1e-5). f16/bf16: a device
// may round the activations to the weight type (2^-11, 2^-8 per product). Block formats of 32: a
// device may quantize activations to 8 bits per block of 32, as ggml does (step amax/127, so <~1%);
// the super-block formats likewise per super-block of 256 (ggml's q8_K).
double gemm_tolerance(DType t) {
  switch (t) {
    case DType::F32: return 1e-5;
    case DType::F16: return 1.5e-3;
    case DType::BF16: return 1e-2;
    default: return 2e-2;
  }
}

struct GemmShape {
  int64_t m, n, k;
};

TEST_P(BackendConformance, GemmMatchesReferenceForEveryWeightType) {
  // Float types take any k (odd ones too); block types need whole blocks of 32.
  const std::vector<GemmShape> float_shapes = {{1, 1, 7}, {2, 9, 64}, {3, 5, 33}, {17, 37, 129}, {4, 13, 160}, {7, 50, 150}};
  // Blocks of 32: rows with and without whole 256s. m = 1 (decode), small batches, and m past 8 and
  // past 64 (the prefill paths: tiled kernels, or a vendor BLAS over the expanded weight).
  const std::vector<GemmShape> block_shapes = {{1, 1, 32}, {3, 5, 96}, {17, 37, 160}, {2, 9, 256}, {70, 6, 96}};
  const std::vector<GemmShape> kquant_shapes = {{1, 3, 256}, {2, 9, 512}, {5, 7, 256}, {13, 5, 768}, {66, 4, 512}};
  std::vector<DType> types = {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0};
  types.insert(types.end(), std::begin(kRawBlockTypes), std::end(kRawBlockTypes));
  int ran = 0;
  for (DType t : types) {
    if (!claims(Op::gemm, t)) continue;
    const bool kquant = dtype_block_elems(t) == 256;
    for (const GemmShape& s : dtype_is_float(t) ? float_shapes : kquant ? kquant_shapes : block_shapes) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " m=" + std::to_string(s.m) + " n=" + std::to_string(s.n) +
                   " k=" + std::to_string(s.k));
      const uint64_t seed = 1000 * uint64_t(t) + uint64_t(s.m * 31 + s.n * 7 + s.k);
      const auto w = random_floats(size_t(s.n * s.k), seed);
      const auto x = random_floats(size_t(s.m * s.k), seed + 1);
      const auto packed = encode_any(t, w, s.n, s.k);
      const auto wd = dequantize(t, packed, s.n, s.k);  // what the kernel is meant to multiply by

      std::vector<double> want(size_t(s.m * s.n)), mag(want.size());
      for (int64_t i = 0; i < s.m; ++i) {
        for (int64_t j = 0; j < s.n; ++j) {
          double acc = 0, abs_acc = 0;
          for (int64_t p = 0; p < s.k; ++p) {
            const double prod = double(x[size_t(i * s.k + p)]) * double(wd[size_t(j * s.k + p)]);
            acc += prod;
            abs_acc += std::abs(prod);
          }
          want[size_t(i * s.n + j)] = acc;
          mag[size_t(i * s.n + j)] = abs_acc;
        }
      }

      // As written (row-major), then after prepare_weight rearranged it as Linears have it.
      DeviceBuffer wbuf = upload(b(), packed), xbuf = upload(b(), x);
      for (bool prepared : {false, true}) {
        SCOPED_TRACE(prepared ? "prepared weight" : "row-major weight");
        DeviceBuffer ybuf = output(want.size());
        WeightView view{wbuf.get(), t, s.n, s.k};
        if (prepared) b().prepare_weight(view);
        b().gemm(xbuf.as<float>(), s.m, view, ybuf.as<float>());
        b().synchronize();
        const auto y = read_output(ybuf, want.size());
        const double tol = gemm_tolerance(t);
        EXPECT_TRUE(all_close(y, want, [&](size_t i) { return tol * mag[i] + 1e-30; }));
      }
      ++ran;
    }
  }
  if (ran == 0) GTEST_SKIP() << "backend claims no gemm weight type";
}

// Integer weights as the int8 and int4 quantizers hand them to a backend: I8 with a scale per row
// (w = q * s), I4 two a byte (low nibble first) with a scale per group and a zero point per group
// (asymmetric) or 8 (symmetric): w = (q - z) * s. A backend may quantize x to int8 per token or per
// block of 32 (symmetric, rounding to nearest): each x then moves by at most its amax / 254, so an
// output by at most that times the row's sum of |w| (checked with twice that margin).
TEST_P(BackendConformance, IntegerGemmsMatchTheirDequantizedWeights) {
  struct IntCase {
    DType type;
    int64_t group;  // I4 only
    bool asymmetric;
  };
  const std::vector<IntCase> cases = {{DType::I8, 0, false}, {DType::I4, 32, false}, {DType::I4, 32, true},
                                      {DType::I4, 64, true}};
  const std::vector<GemmShape> shapes = {{1, 16, 64}, {5, 24, 128}, {19, 40, 192}};
  int ran = 0;
  for (const IntCase& c : cases) {
    if (!claims(Op::gemm, c.type)) continue;
    for (const GemmShape& s : shapes) {
      SCOPED_TRACE(std::string(dtype_name(c.type)) + (c.group ? " group " + std::to_string(c.group) : "") +
                   (c.asymmetric ? " asymmetric" : "") + " m=" + std::to_string(s.m) + " n=" + std::to_string(s.n) +
                   " k=" + std::to_string(s.k));
      const uint64_t seed = 7000 + uint64_t(s.m * 31 + s.n * 7 + s.k) + (c.asymmetric ? 1 : 0) + uint64_t(c.group);
      const auto w = random_floats(size_t(s.n * s.k), seed);
      const auto x = random_floats(size_t(s.m * s.k), seed + 1, -2, 2);
      const int64_t group = c.type == DType::I8 ? s.k : c.group, groups = s.k / group;
      std::vector<float> scales(size_t(s.n * groups)), zeros(c.asymmetric ? scales.size() : 0), wd(w.size());
      std::vector<uint8_t> packed(c.type == DType::I8 ? size_t(s.n * s.k) : size_t(s.n * s.k / 2), 0);
      for (int64_t j = 0; j < s.n; ++j) {
        for (int64_t gi = 0; gi < groups; ++gi) {
          const float* src = w.data() + j * s.k + gi * group;
          const auto [lo, hi] = std::minmax_element(src, src + group);
          const float amax = std::max(std::abs(*lo), std::abs(*hi));
          float& scale = scales[size_t(j * groups + gi)];
          float zero = 8;
          if (c.type == DType::I8) {
            scale = amax / 127;
          } else if (c.asymmetric) {
            scale = (*hi - *lo) / 15;
            zero = -*lo / scale;
            zeros[size_t(j * groups + gi)] = zero;
          } else {
            scale = amax / 7;
          }
          for (int64_t e = 0; e < group; ++e) {
            const int64_t col = gi * group + e;
            if (c.type == DType::I8) {
              const auto q = int8_t(std::lround(src[e] / scale));
              packed[size_t(j * s.k + col)] = uint8_t(q);
              wd[size_t(j * s.k + col)] = float(q) * scale;
            } else {
              const long q = std::clamp<long>(std::lround(src[e] / scale + zero), 0, 15);
              packed[size_t((j * s.k + col) / 2)] |= uint8_t(q << (col % 2 == 0 ? 0 : 4));
              wd[size_t(j * s.k + col)] = (float(q) - zero) * scale;
            }
          }
        }
      }
      std::vector<double> want(size_t(s.m * s.n)), bound(want.size());
      for (int64_t i = 0; i < s.m; ++i) {
        const float* xr = x.data() + i * s.k;
        const double amax = std::abs(*std::max_element(xr, xr + s.k, [](float a, float b) { return std::abs(a) < std::abs(b); }));
        for (int64_t j = 0; j < s.n; ++j) {
          double acc = 0, abs_w = 0;
          for (int64_t p = 0; p < s.k; ++p) {
            acc += double(xr[p]) * wd[size_t(j * s.k + p)];
            abs_w += std::abs(wd[size_t(j * s.k + p)]);
          }
          want[size_t(i * s.n + j)] = acc;
          bound[size_t(i * s.n + j)] = amax / 127 * abs_w + 1e-5 * std::abs(acc) + 1e-6;
        }
      }
      DeviceBuffer sbuf = upload(b(), scales), zbuf = upload(b(), c.asymmetric ? zeros : std::vector<float>(1)),
                   xbuf = upload(b(), x);
      for (bool prepared : {false, true}) {
        SCOPED_TRACE(prepared ? "prepared weight" : "row-major weight");
        DeviceBuffer wbuf = upload(b(), packed), ybuf = output(want.size());
        WeightView view{wbuf.get(), c.type, s.n, s.k, sbuf.as<float>(), c.asymmetric ? zbuf.as<float>() : nullptr,
                        c.type == DType::I4 ? group : 0};
        if (prepared) b().prepare_weight(view);
        b().gemm(xbuf.as<float>(), s.m, view, ybuf.as<float>());
        b().synchronize();
        EXPECT_TRUE(all_close(read_output(ybuf, want.size()), want, [&](size_t i) { return bound[i]; }));
      }
      ++ran;
    }
  }
  if (ran == 0) GTEST_SKIP() << "backend claims no integer gemm";
}

// ---- embedding ------------------------------------------------------------------------------------

TEST_P(BackendConformance, EmbeddingGathersDequantizedRows) {
  const int64_t vocab = 37;
  const std::vector<int32_t> ids = {0, 36, 5, 5, 17, 1};
  std::vector<DType> types = {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0};
  types.insert(types.end(), std::begin(kRawBlockTypes), std::end(kRawBlockTypes));
  for (DType t : types) {
    if (!claims(Op::embedding, t)) continue;
    const int64_t dim = dtype_is_float(t) ? 33 : dtype_block_elems(t) == 256 ? 512 : 64;
    SCOPED_TRACE(std::string(dtype_name(t)) + " dim=" + std::to_string(dim));
    const auto table = encode_any(t, random_floats(size_t(vocab * dim), 77 + uint64_t(t), -3, 3), vocab, dim);
    const auto rows = dequantize(t, table, vocab, dim);
    std::vector<double> want;
    for (int32_t id : ids) {
      for (int64_t d = 0; d < dim; ++d) want.push_back(rows[size_t(id * dim + d)]);
    }
    DeviceBuffer tbuf = upload(b(), table), ibuf = upload(b(), ids), obuf = output(want.size());
    b().embedding(WeightView{tbuf.get(), t, vocab, dim}, ibuf.as<int32_t>(), int64_t(ids.size()), obuf.as<float>());
    b().synchronize();
    // Dequantizing is exact in float (fp16 scale times a small integer), so only rounding noise: of
    // the value, or, where a min is subtracted (which a backend may fuse into one fma), of the
    // largest term.
    double amax = 0;
    for (double v : want) amax = std::max(amax, std::abs(v));
    const double term_noise = fp16_scales_per_block(t) > 1 ? 1e-6 * amax : 0.0;
    EXPECT_TRUE(all_close(read_output(obuf, want.size()), want,
                          [&](size_t i) { return 1e-6 * std::abs(want[i]) + term_noise; }));
  }
}

// ---- elementwise and row ops ----------------------------------------------------------------------

TEST_P(BackendConformance, RmsNormMatchesReferenceAlsoInPlace) {
  if (!claims(Op::rms_norm, DType::F32)) GTEST_SKIP() << "rms_norm not supported";
  const float eps = 1e-5f;
  for (int64_t dim : {37, 65, 256}) {
    const int64_t rows = 3;
    const auto x = random_floats(size_t(rows * dim), 200 + uint64_t(dim), -2, 2);
    const auto w = random_floats(size_t(dim), 300 + uint64_t(dim), 0.5f, 1.5f);
    std::vector<double> want(x.size());
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < dim; ++i) ss += double(x[size_t(r * dim + i)]) * x[size_t(r * dim + i)];
      const double scale = 1.0 / std::sqrt(ss / double(dim) + eps);
      for (int64_t i = 0; i < dim; ++i) want[size_t(r * dim + i)] = x[size_t(r * dim + i)] * scale * w[size_t(i)];
    }
    auto bound = [&](size_t i) { return 2e-5 * std::abs(want[i]) + 1e-6; };
    DeviceBuffer xbuf = upload(b(), x, kGuard), wbuf = upload(b(), w);
    poison(b(), xbuf.as<float>() + x.size(), kGuard);
    {
      SCOPED_TRACE("dim " + std::to_string(dim) + ", separate output");
      DeviceBuffer obuf = output(x.size());
      b().rms_norm(xbuf.as<float>(), wbuf.as<float>(), obuf.as<float>(), rows, dim, eps);
      b().synchronize();
      EXPECT_TRUE(all_close(read_output(obuf, x.size()), want, bound));
      EXPECT_EQ(download<float>(b(), xbuf.get(), x.size()), x) << "input changed";
    }
    {
      SCOPED_TRACE("dim " + std::to_string(dim) + ", in place (out == x)");
      b().rms_norm(xbuf.as<float>(), wbuf.as<float>(), xbuf.as<float>(), rows, dim, eps);
      b().synchronize();
      EXPECT_TRUE(all_close(read_output(xbuf, x.size()), want, bound));
    }
  }
}

TEST_P(BackendConformance, RopeRotatesPairsAndLeavesPositionZeroUnchanged) {
  if (!claims(Op::rope, DType::F32)) GTEST_SKIP() << "rope not supported";
  const std::vector<int32_t> positions = {0, 1, 7, 100, 511, 0};
  const int64_t rows = int64_t(positions.size()), n_heads = 3;
  const float theta = 10000.0f;
  for (RopeStyle style : {RopeStyle::adjacent, RopeStyle::neox}) {
    for (int64_t head_dim : {8, 64}) {
      for (int64_t rope_dim : {head_dim, head_dim / 2}) {  // partial rotary leaves the tail alone
        SCOPED_TRACE(std::string(style == RopeStyle::adjacent ? "adjacent" : "neox") + " head_dim " +
                     std::to_string(head_dim) + " rope_dim " + std::to_string(rope_dim));
        const auto x = random_floats(size_t(rows * n_heads * head_dim), 400 + uint64_t(head_dim + rope_dim));
        std::vector<double> want(x.begin(), x.end());
        const int64_t half = rope_dim / 2;
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t h = 0; h < n_heads; ++h) {
            const size_t base = size_t((r * n_heads + h) * head_dim);
            for (int64_t i = 0; i < half; ++i) {
              const double angle = positions[size_t(r)] * std::pow(double(theta), -2.0 * double(i) / double(rope_dim));
              const size_t i0 = base + size_t(style == RopeStyle::adjacent ? 2 * i : i);
              const size_t i1 = base + size_t(style == RopeStyle::adjacent ? 2 * i + 1 : i + half);
              want[i0] = x[i0] * std::cos(angle) - x[i1] * std::sin(angle);
              want[i1] = x[i0] * std::sin(angle) + x[i1] * std::cos(angle);
            }
          }
        }
        DeviceBuffer xbuf = upload(b(), x, kGuard), pbuf = upload(b(), positions);
        poison(b(), xbuf.as<float>() + x.size(), kGuard);
        b().rope(xbuf.as<float>(), pbuf.as<int32_t>(), rows, n_heads, head_dim, rope_dim, theta, style);
        b().synchronize();
        const auto got = read_output(xbuf, x.size());
        // Angles up to 511 rad computed in float are good to ~3e-5.
        EXPECT_TRUE(all_close(got, want, [](size_t) { return 1e-4; }));
        const size_t row = size_t(n_heads * head_dim);
        for (size_t r : {size_t(0), size_t(5)}) {  // position 0: rotation by zero is exact
          EXPECT_TRUE(std::equal(x.begin() + r * row, x.begin() + (r + 1) * row, got.begin() + r * row))
              << "row " << r << " at position 0 changed";
        }
        for (size_t i = 0; i < x.size(); ++i) {
          if (int64_t(i) % head_dim >= rope_dim && got[i] != x[i]) {
            ADD_FAILURE() << "element " << i << " beyond rope_dim changed";
            break;
          }
        }
      }
    }
  }
}

TEST_P(BackendConformance, SiluMulMatchesReferenceAlsoInPlace) {
  if (!claims(Op::silu_mul, DType::F32)) GTEST_SKIP() << "silu_mul not supported";
  const size_t n = 1001;
  const auto gate = random_floats(n, 500, -10, 10);
  const auto up = random_floats(n, 501, -2, 2);
  std::vector<double> want(n);
  for (size_t i = 0; i < n; ++i) want[i] = double(gate[i]) / (1.0 + std::exp(-double(gate[i]))) * up[i];
  auto bound = [&](size_t i) { return 1e-5 * std::abs(want[i]) + 1e-7; };
  DeviceBuffer gbuf = upload(b(), gate, kGuard), ubuf = upload(b(), up), obuf = output(n);
  poison(b(), gbuf.as<float>() + n, kGuard);
  b().silu_mul(gbuf.as<float>(), ubuf.as<float>(), obuf.as<float>(), int64_t(n));
  b().synchronize();
  EXPECT_TRUE(all_close(read_output(obuf, n), want, bound));
  // The model runs it in place on the gate (silu_mul(hb, hb2, hb)).
  b().silu_mul(gbuf.as<float>(), ubuf.as<float>(), gbuf.as<float>(), int64_t(n));
  b().synchronize();
  EXPECT_TRUE(all_close(read_output(gbuf, n), want, bound)) << "in place";
}

TEST_P(BackendConformance, AddIsExactAlsoInPlace) {
  if (!claims(Op::add, DType::F32)) GTEST_SKIP() << "add not supported";
  const size_t n = 1001;
  const auto a = random_floats(n, 600, -100, 100), c = random_floats(n, 601, -1, 1);
  std::vector<float> sum(n);
  for (size_t i = 0; i < n; ++i) sum[i] = a[i] + c[i];  // one IEEE rounding: every device agrees
  DeviceBuffer abuf = upload(b(), a, kGuard), cbuf = upload(b(), c), obuf = output(n);
  poison(b(), abuf.as<float>() + n, kGuard);
  b().add(abuf.as<float>(), cbuf.as<float>(), obuf.as<float>(), int64_t(n));
  b().synchronize();
  EXPECT_EQ(read_output(obuf, n), sum);
  // The residual stream is updated in place: add(x, y, x).
  b().add(abuf.as<float>(), cbuf.as<float>(), abuf.as<float>(), int64_t(n));
  b().synchronize();
  EXPECT_EQ(read_output(abuf, n), sum) << "in place";
}

TEST_P(BackendConformance, SoftmaxIsStableAndNormalised) {
  if (!claims(Op::softmax, DType::F32)) GTEST_SKIP() << "softmax not supported";
  for (int64_t cols : {1, 7, 1001}) {
    SCOPED_TRACE("cols " + std::to_string(cols));
    const int64_t rows = 4;
    std::vector<float> x;
    const auto r0 = random_floats(size_t(cols), 700, -5, 5);
    const auto r1 = random_floats(size_t(cols), 701, 80, 100);     // exp overflows without the max shift
    const auto r2 = random_floats(size_t(cols), 702, -100, -80);   // and underflows to 0/0
    x.insert(x.end(), r0.begin(), r0.end());
    x.insert(x.end(), r1.begin(), r1.end());
    x.insert(x.end(), r2.begin(), r2.end());
    x.insert(x.end(), size_t(cols), 3.0f);  // uniform
    std::vector<double> want(x.size());
    for (int64_t r = 0; r < rows; ++r) {
      const float* v = x.data() + r * cols;
      const double mx = *std::max_element(v, v + cols);
      double sum = 0;
      for (int64_t i = 0; i < cols; ++i) sum += std::exp(v[i] - mx);
      for (int64_t i = 0; i < cols; ++i) want[size_t(r * cols + i)] = std::exp(v[i] - mx) / sum;
    }
    DeviceBuffer xbuf = upload(b(), x, kGuard);
    poison(b(), xbuf.as<float>() + x.size(), kGuard);
    b().softmax(xbuf.as<float>(), rows, cols);
    b().synchronize();
    EXPECT_TRUE(all_close(read_output(xbuf, x.size()), want, [&](size_t i) { return 1e-5 * want[i] + 1e-7; }));
  }
}

TEST_P(BackendConformance, ArgmaxPicksTheFirstMaximum) {
  if (!claims(Op::argmax, DType::F32)) GTEST_SKIP() << "argmax not supported";
  const int64_t cols = 1003;
  std::vector<float> x;
  std::vector<int32_t> want;
  auto row = [&](std::vector<float> v, int32_t expect) {
    x.insert(x.end(), v.begin(), v.end());
    want.push_back(expect);
  };
  auto tie = random_floats(size_t(cols), 800, -1, 1);
  tie[3] = tie[900] = 5.0f;
  row(tie, 3);
  row(std::vector<float>(size_t(cols), 0.25f), 0);  // all equal: the first
  auto last = random_floats(size_t(cols), 801, -1, 1);
  last[size_t(cols - 1)] = 2.0f;
  row(last, int32_t(cols - 1));
  auto neg = random_floats(size_t(cols), 802, -90, -10);
  neg[517] = -1.0f;
  row(neg, 517);
  auto with_inf = random_floats(size_t(cols), 803, -1, 1);
  with_inf[0] = -INFINITY;
  with_inf[42] = 7.0f;
  with_inf[43] = 7.0f;
  row(with_inf, 42);
  const int64_t rows = int64_t(want.size());
  DeviceBuffer xbuf = upload(b(), x);
  DeviceBuffer obuf = upload(b(), std::vector<int32_t>(size_t(rows + 4), -7));
  b().argmax(xbuf.as<float>(), rows, cols, obuf.as<int32_t>());
  b().synchronize();
  auto got = download<int32_t>(b(), obuf.get(), size_t(rows + 4));
  EXPECT_EQ(std::vector<int32_t>(got.begin() + rows, got.end()), std::vector<int32_t>(4, -7)) << "wrote past rows";
  got.resize(size_t(rows));
  EXPECT_EQ(got, want);
}

INSTANTIATE_TEST_SUITE_P(Backends, BackendConformance, testing::ValuesIn(plugin_names(ComponentKind::backend)),
                         param_name);

}  // namespace
}  // namespace tessera
