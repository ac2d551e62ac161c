// quantizer: gguf, through the real loader: blocks from the file are what the backend holds (every
// block byte for byte, possibly reordered into the CPU's tiles; no float copy), keep_float expands
// only the named tensors, a backend without the block kernel is refused by tensor and type, the CPU
// integer-dot kernels match a double-precision reference on awkward shapes, and the q8_0 model
// keeps its reference perplexity and greedy tokens.
#include <gtest/gtest.h>
#include <gmock/gmock.h>
#include <cpuid.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "tessera/device_buffer.h"
#include "tessera/engine.h"
#include "tessera/error.h"
#include "tessera/eval.h"
#include "tessera/gguf.h"
#include "tessera/quantize_blocks.h"
#include "tessera/quantizer.h"
#include "tessera/synth.h"

namespace tessera {
namespace {

using nlohmann::json;
using testing::HasSubstr;

std::shared_ptr<Backend> cpu_backend() {
  static std::shared_ptr<Backend> b = test::plugins().create<Backend>("cpu", json::object(), "test");
  return b;
}

std::shared_ptr<Quantizer> gguf(const json& params = json::object()) {
  return test::plugins().create<Quantizer>("gguf", params, "test");
}

WeightSource source(const GgufTensor& t) { return {t.name, t.dtype, t.data, t.rows(), t.row_length()}; }

bool is_linear(const GgufTensor& t) {
  return t.shape.size() == 2 && t.name != "token_embd.weight";
}

// The CPU backend's prepare_weight (kernels_cpu/gemm_blocks_cpu.h) first stores whole 8-row bands:
// per block the eight rows' fp16 scales, then per row pair and per 16 bytes of quants the two
// rows' chunks side by side. Then it interleaves the blocks of a whole 4-row tile (row 0 block 0,
// row 1 block 0, ..., row 3 block 0, row 0 block 1, ...); a last partial tile stays row-major.
// Each layout marks the view with a kernel_variant flag.
constexpr int32_t kCpuPackedTiles = 1 << 8;
constexpr int32_t kCpuPackedBands = 1 << 9;
constexpr int32_t kCpuScalarVariant = 2;
constexpr int32_t kCpuAvx2Variant = 3;
constexpr int32_t kCpuVnniVariant = 4;

bool cpu_packs_blocks() {
  __builtin_cpu_init();
  // F16C from CPUID.1:ECX bit 29: clang before 16 has no "f16c" for __builtin_cpu_supports.
  unsigned a = 0, b = 0, c = 0, d = 0;
  const bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) != 0;
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
}

// Where byte i of block b of row r lies in the bytes a view holds (i < 2: the fp16 scale).
size_t held_byte(const WeightView& v, int64_t r, int64_t b, size_t i) {
  const size_t bb = dtype_block_bytes(v.dtype);
  const size_t row = dtype_row_bytes(v.dtype, v.cols);
  if ((v.kernel_variant & kCpuPackedBands) != 0 && r < v.rows / 8 * 8) {
    const int64_t band = r / 8 * 8, in = r - band;
    const size_t block = size_t(band) * row + size_t(b * 8) * bb;
    if (i < 2) return block + size_t(in) * 2 + i;
    const size_t q = i - 2, quants = bb - 2;
    return block + 16 + size_t(in / 2) * 2 * quants + q / 16 * 32 + size_t(in % 2) * 16 + q % 16;
  }
  const int64_t tile = r / 4 * 4;
  if ((v.kernel_variant & kCpuPackedTiles) != 0 && tile + 4 <= v.rows) {
    return size_t(tile) * row + size_t(b * 4 + (r - tile)) * bb + i;
  }
  return size_t(r) * row + size_t(b) * bb + i;
}

// Every block of the source is held unchanged (scale and quants), at its place in the layout.
void expect_blocks_as_stored(Backend& b, const Linear& l, const uint8_t* file, size_t nbytes) {
  const WeightView v = l.view();
  ASSERT_EQ(dtype_row_bytes(v.dtype, v.cols) * size_t(v.rows), nbytes);
  if (cpu_packs_blocks()) EXPECT_NE(v.kernel_variant & kCpuPackedTiles, 0) << "AVX2 CPUs stream packed tiles";
  std::vector<uint8_t> held(nbytes);
  b.copy_to_host(held.data(), v.data, nbytes);
  const size_t bb = dtype_block_bytes(v.dtype);
  const size_t row = dtype_row_bytes(v.dtype, v.cols);
  const int64_t blocks = int64_t(row / bb);
  for (int64_t r = 0; r < v.rows; ++r) {
    for (int64_t blk = 0; blk < blocks; ++blk) {
      for (size_t i = 0; i < bb; ++i) {
        ASSERT_EQ(held[held_byte(v, r, blk, i)], file[size_t(r) * row + size_t(blk) * bb + i])
            << "row " << r << " block " << blk << " byte " << i;
      }
    }
  }
}

TEST(Gguf, Q8BlocksAreTheFileBlocksInTileOrder) {
  TESSERA_SKIP_WITHOUT_AVX2();
  auto file = GgufFile::open(test::kStoriesQ8);
  auto q = gguf();
  Backend& b = *cpu_backend();
  int q8_tensors = 0;
  for (const GgufTensor& t : file->tensors()) {
    if (!is_linear(t)) continue;
    SCOPED_TRACE(t.name);
    auto l = q->make_linear(b, source(t));
    EXPECT_EQ(l->format(), std::string(dtype_name(t.dtype)));
    EXPECT_EQ(l->resident_bytes(), t.nbytes) << "no float copy, no extra memory";
    EXPECT_EQ(l->view().dtype, t.dtype);
    // Blocks keep the file's bytes, only reordered into tiles; f32 tensors (ffn_down here) are
    // packed into panels of transposed rows, which the conformance suite checks by result.
    if (t.dtype == DType::Q8_0) {
      expect_blocks_as_stored(b, *l, static_cast<const uint8_t*>(t.data), t.nbytes);
      ++q8_tensors;
    }
  }
  EXPECT_GE(q8_tensors, 30);
}

TEST(Gguf, PartialTilesStayRowMajor) {
  TESSERA_SKIP_WITHOUT_AVX2();
  // 7 rows: one packed tile, then three rows as the file has them.
  for (DType t : {DType::Q8_0, DType::Q4_0}) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    const int64_t n = 7, k = 96;
    const auto w = test::random_floats(size_t(n * k), 5);
    std::vector<uint8_t> bytes(dtype_row_bytes(t, k) * size_t(n));
    for (int64_t r = 0; r < n; ++r) quantize_row(t, w.data() + r * k, bytes.data() + size_t(r) * dtype_row_bytes(t, k), k);
    auto l = gguf()->make_linear(*cpu_backend(), {"blk.0.ffn_up.weight", t, bytes.data(), n, k});
    expect_blocks_as_stored(*cpu_backend(), *l, bytes.data(), bytes.size());
  }
}

TEST(Gguf, BandsHoldEveryScaleAndQuantAsStored) {
  TESSERA_SKIP_WITHOUT_AVX2();
  // 15 rows: one band of 8, one packed tile of 4, then three rows as the file has them.
  for (DType t : {DType::Q8_0, DType::Q4_0}) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    const int64_t n = 15, k = 96;
    const auto w = test::random_floats(size_t(n * k), 6);
    const size_t row = dtype_row_bytes(t, k);
    std::vector<uint8_t> bytes(row * size_t(n));
    for (int64_t r = 0; r < n; ++r) quantize_row(t, w.data() + r * k, bytes.data() + size_t(r) * row, k);
    auto l = gguf()->make_linear(*cpu_backend(), {"blk.0.ffn_up.weight", t, bytes.data(), n, k});
    if (cpu_packs_blocks()) EXPECT_NE(l->view().kernel_variant & kCpuPackedBands, 0);
    expect_blocks_as_stored(*cpu_backend(), *l, bytes.data(), bytes.size());
  }
}

TEST(Gguf, ModelHoldsTheFileTensorsAsStored) {
  // Backend memory for weights is exactly the file's tensor bytes (the head counts token_embd again
  // when it is tied): no float copy anywhere.
  auto file = GgufFile::open(test::kStoriesQ8);
  size_t file_bytes = 0;
  for (const GgufTensor& t : file->tensors()) file_bytes += t.nbytes;
  if (file->find_tensor("output.weight") == nullptr) file_bytes += file->find_tensor("token_embd.weight")->nbytes;
  auto p = test::cpu_pipeline(test::kStoriesQ8, {{"quantizer", {{"plugin", "gguf"}}}});
  EXPECT_EQ(p->model().weight_bytes(), file_bytes);
  // stories260K-q8_0 keeps ffn_down (172 columns, not whole blocks) in f32, as llama.cpp wrote it.
  EXPECT_EQ(p->model().weight_formats(), "f32 x 5, q8_0 x 31");
  auto none = test::cpu_pipeline(test::kStoriesQ8);
  EXPECT_LT(p->model().weight_bytes() * 2, none->model().weight_bytes());
}

TEST(Gguf, KeepFloatExpandsOnlyTheNamedTensors) {
  auto p = test::cpu_pipeline(test::kStoriesQ8, {{"quantizer", {{"plugin", "gguf"}, {"keep_float", {"output"}}}}});
  EXPECT_THAT(p->model().weight_formats(), HasSubstr("f32 (keep_float) x 1"));
  auto file = GgufFile::open(test::kStoriesQ8);
  const GgufTensor& t = *file->find_tensor("blk.0.attn_q.weight");
  auto l = gguf({{"keep_float", {"blk.0.*"}}})->make_linear(*cpu_backend(), source(t));
  EXPECT_EQ(l->format(), "f32 (keep_float)");
  EXPECT_EQ(l->resident_bytes(), size_t(t.rows() * t.row_length() * 4));

  // A layer's q|k|v joins only where keep_float treats the parts alike.
  std::vector<WeightSource> qkv;
  for (const char* part : {"attn_q", "attn_k", "attn_v"}) {
    qkv.push_back(source(*file->find_tensor(std::string("blk.1.") + part + ".weight")));
  }
  EXPECT_EQ(gguf({{"keep_float", {"*.attn_v.*"}}})->make_fused_linear(*cpu_backend(), qkv), nullptr);
  auto joined = gguf({{"keep_float", {"blk.0.*"}}})->make_fused_linear(*cpu_backend(), qkv);
  ASSERT_NE(joined, nullptr);
  EXPECT_EQ(joined->format(), "q8_0");
  EXPECT_EQ(joined->resident_bytes(), size_t(qkv[0].rows + qkv[1].rows + qkv[2].rows) * 2 * 34)
      << "the blocks as stored";
}

TEST(Gguf, FloatAndQ4Files) {
  // A float file stays float; a q4_0 file runs on its q4_0 blocks.
  test::TempDir dir;
  SynthSpec spec = synth_preset("tiny");
  spec.dtype = DType::Q4_0;
  spec.ffn_dim = 192;  // whole blocks everywhere (172 would leave ffn_down in f32)
  const std::string path = dir.path() + "/tiny-q4.gguf";
  write_synthetic_model(spec, path);
  auto q4 = test::cpu_pipeline(path, {{"quantizer", {{"plugin", "gguf"}}}});
  EXPECT_THAT(q4->model().weight_formats(), HasSubstr("q4_0 x "));
  EXPECT_THAT(q4->model().weight_formats(), testing::Not(HasSubstr("f32")));
  auto f32 = test::cpu_pipeline(test::kStoriesF32, {{"quantizer", {{"plugin", "gguf"}}}});
  EXPECT_EQ(f32->model().weight_formats(), "f32 x 36");
}

// The CPU backend, but without block-quantized gemm: stands in for a device lacking the kernel.
class NoBlockGemm final : public Backend {
 public:
  explicit NoBlockGemm(std::shared_ptr<Backend> inner) : b_(std::move(inner)) {}
  std::string_view name() const override { return "noblocks"; }
  std::vector<DeviceInfo> devices() const override { return b_->devices(); }
  bool supports(Op op, DType dtype) const override {
    return !(op == Op::gemm && !dtype_is_float(dtype)) && b_->supports(op, dtype);
  }
  void* allocate(size_t bytes) override { return b_->allocate(bytes); }
  void deallocate(void* p) noexcept override { b_->deallocate(p); }
  void copy_to_device(void* d, const void* s, size_t n) override { b_->copy_to_device(d, s, n); }
  void copy_to_host(void* d, const void* s, size_t n) override { b_->copy_to_host(d, s, n); }
  void copy_on_device(void* d, const void* s, size_t n) override { b_->copy_on_device(d, s, n); }
  void fill_zero(void* d, size_t n) override { b_->fill_zero(d, n); }
  void synchronize() override { b_->synchronize(); }
  void embedding(const WeightView& t, const int32_t* ids, int64_t n, float* out) override { b_->embedding(t, ids, n, out); }
  void gemm(const float* x, int64_t m, const WeightView& w, float* y) override { b_->gemm(x, m, w, y); }
  void rms_norm(const float* x, const float* w, float* out, int64_t rows, int64_t dim, float eps) override {
    b_->rms_norm(x, w, out, rows, dim, eps);
  }
  void rope(float* x, const int32_t* pos, int64_t rows, int64_t nh, int64_t hd, int64_t rd, float theta,
            RopeStyle style) override {
    b_->rope(x, pos, rows, nh, hd, rd, theta, style);
  }
  void silu_mul(const float* g, const float* u, float* out, int64_t n) override { b_->silu_mul(g, u, out, n); }
  void rope_freqs(float* x, const int32_t* p, int64_t r, int64_t h, int64_t hd, int64_t rd, const float* f, float ms,
                  RopeStyle s) override {
    b_->rope_freqs(x, p, r, h, hd, rd, f, ms, s);
  }
  void gelu_mul(const float* g, const float* u, float* o, int64_t n) override { b_->gelu_mul(g, u, o, n); }
  void add_rows(float* x, const float* row, int64_t r, int64_t c) override { b_->add_rows(x, row, r, c); }
  void scale(float* x, float s, int64_t n) override { b_->scale(x, s, n); }
  void add(const float* a, const float* b, float* out, int64_t n) override { b_->add(a, b, out, n); }
  void softmax(float* x, int64_t rows, int64_t cols) override { b_->softmax(x, rows, cols); }
  void kv_write(const KvLayerView& kv, const float* k, const float* v, const int32_t* slots, int64_t rows) override {
    b_->kv_write(kv, k, v, slots, rows);
  }
  void attention(const AttentionArgs& args, const KvLayerView& kv) override { b_->attention(args, kv); }
  void attention_block_scores(const AttentionArgs& a, const KvLayerView& kv, float* s) override {
    b_->attention_block_scores(a, kv, s);
  }
  void argmax(const float* logits, int64_t rows, int64_t cols, int32_t* out) override {
    b_->argmax(logits, rows, cols, out);
  }

 private:
  std::shared_ptr<Backend> b_;
};

TEST(Gguf, BackendWithoutTheBlockKernelIsRefusedByTensorAndType) {
  NoBlockGemm backend(cpu_backend());
  auto file = GgufFile::open(test::kStoriesQ8);
  const GgufTensor& t = *file->find_tensor("blk.0.attn_q.weight");
  ASSERT_EQ(t.dtype, DType::Q8_0);
  try {
    gguf()->make_linear(backend, source(t));
    FAIL() << "accepted q8_0 on a backend without it";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("blk.0.attn_q.weight"));
    EXPECT_THAT(e.what(), HasSubstr("q8_0"));
    EXPECT_THAT(e.what(), HasSubstr("noblocks"));
  }
  // keep_float is the way out.
  auto l = gguf({{"keep_float", {"blk.0.*"}}})->make_linear(backend, source(t));
  EXPECT_EQ(l->format(), "f32 (keep_float)");
}

// ---- the CPU integer-dot kernels --------------------------------------------------------------
// Q8_0 and Q4_0 run as llama.cpp does: x is quantized per block of 32 (d = amax/127, q = round(x/d)
// to nearest even) and each block pair is an int8 dot times d_w·d_x, summed in float. So the exact
// answer is the dot of the dequantized weights with the dequantized activations; all that may
// differ is float rounding of the block sums (a few ulps of Σ|w·x|).

std::vector<double> q8_activations(const std::vector<float>& x) {
  std::vector<double> out(x.size());
  for (size_t b = 0; b < x.size() / 32; ++b) {
    const float* xb = x.data() + b * 32;
    float amax = 0;
    for (int c = 0; c < 32; ++c) amax = std::max(amax, std::fabs(xb[c]));
    const float d = amax / 127.0f;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    for (int c = 0; c < 32; ++c) out[b * 32 + c] = double(std::nearbyint(xb[c] * id)) * double(d);
  }
  return out;
}

struct BlockGemmCase {
  DType t;
  int64_t m, n, k;
  std::vector<uint8_t> bytes;  // the weight as a file stores it
  std::vector<float> x;
  std::vector<double> want, mag;  // reference y, and Σ|w·x| per output
};

BlockGemmCase block_case(DType t, int64_t m, int64_t n, int64_t k, uint64_t seed) {
  BlockGemmCase c{t, m, n, k, {}, test::random_floats(size_t(m * k), seed + 1, -3, 3), {}, {}};
  auto w = test::random_floats(size_t(n * k), seed, -2, 2);
  if (n >= 3) std::fill(w.begin() + 2 * k, w.begin() + 3 * k, 0.0f);  // W row 2 zero: scale 0
  if (m >= 2) std::fill(c.x.begin() + k, c.x.begin() + 2 * k, 0.0f);  // x row 1 zero
  if (m >= 3) c.x[size_t(2 * k + k - 1)] = 1e4f;                      // one huge activation
  const size_t row = dtype_row_bytes(t, k);
  c.bytes.resize(row * size_t(n));
  for (int64_t r = 0; r < n; ++r) quantize_row(t, w.data() + r * k, c.bytes.data() + size_t(r) * row, k);
  if (t == DType::Q8_0) {
    // ggml never writes -128, but a file may hold it; the last row gets one per block.
    for (int64_t b = 0; b < k / 32; ++b) c.bytes[size_t(n - 1) * row + size_t(b) * 34 + 2 + size_t(b % 32)] = 0x80;
  }
  std::vector<float> wd(size_t(n * k));
  for (int64_t r = 0; r < n; ++r) dequantize_row(t, c.bytes.data() + size_t(r) * row, wd.data() + r * k, k);
  const auto xd = q8_activations(c.x);
  c.want.resize(size_t(m * n));
  c.mag.resize(c.want.size());
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0, abs_acc = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double prod = xd[size_t(i * k + p)] * double(wd[size_t(j * k + p)]);
        acc += prod;
        abs_acc += std::fabs(prod);
      }
      c.want[size_t(i * n + j)] = acc;
      c.mag[size_t(i * n + j)] = abs_acc;
    }
  }
  return c;
}

// y from a view of the file's bytes as they are (not prepared, unless `prepared`: laid out by the
// backend as a quantizer's are), with the given kernel variant.
std::vector<float> raw_gemm(const BlockGemmCase& c, int32_t variant, bool prepared = false) {
  Backend& b = *cpu_backend();
  DeviceBuffer wb(b, c.bytes.size()), xb(b, c.x.size() * sizeof(float)), yb(b, size_t(c.m * c.n) * sizeof(float));
  wb.upload(c.bytes.data(), c.bytes.size());
  xb.upload(c.x.data(), c.x.size() * sizeof(float));
  WeightView view{wb.get(), c.t, c.n, c.k};
  view.kernel_variant = variant;
  if (prepared) b.prepare_weight(view);
  b.gemm(xb.as<float>(), c.m, view, yb.as<float>());
  b.synchronize();
  std::vector<float> y(size_t(c.m * c.n));
  b.copy_to_host(y.data(), yb.get(), y.size() * sizeof(float));
  return y;
}

void expect_near_reference(const BlockGemmCase& c, const std::vector<float>& y, const std::string& what) {
  ASSERT_EQ(y.size(), c.want.size());
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      const size_t o = size_t(i * c.n + j);
      ASSERT_LE(std::fabs(double(y[o]) - c.want[o]), 3e-6 * c.mag[o] + 1e-30) << what << " y[" << i << "][" << j << "]";
    }
  }
  if (c.m >= 2) {
    for (int64_t j = 0; j < c.n; ++j) EXPECT_EQ(y[size_t(c.n + j)], 0.0f) << what << ": zero x row";
  }
  if (c.n >= 3) {
    for (int64_t i = 0; i < c.m; ++i) EXPECT_EQ(y[size_t(i * c.n + 2)], 0.0f) << what << ": zero W row";
  }
}

// The packed default (through the quantizer, as a model runs), the default on row-major bytes and
// the scalar code all match the reference; the two AVX2 layouts compute the same sums bit for bit.
void check_block_gemm(const BlockGemmCase& c) {
  SCOPED_TRACE(std::string(dtype_name(c.t)) + " m=" + std::to_string(c.m) + " n=" + std::to_string(c.n) +
               " k=" + std::to_string(c.k));
  auto l = gguf()->make_linear(*cpu_backend(), {"blk.0.ffn_up.weight", c.t, c.bytes.data(), c.n, c.k});
  const auto packed = test::linear_forward(*l, c.x, c.m);
  expect_near_reference(c, packed, "packed");
  const auto rows = raw_gemm(c, 0);
  expect_near_reference(c, rows, "row-major");
  EXPECT_EQ(packed, rows);
  expect_near_reference(c, raw_gemm(c, kCpuScalarVariant), "scalar");
  // The kernels one can name give the default's bits: 3 AVX2 alone, 4 VNNI (decode's bands).
  EXPECT_EQ(raw_gemm(c, kCpuAvx2Variant, true), packed) << "avx2";
  if (test::cpu_has_vnni()) EXPECT_EQ(raw_gemm(c, kCpuVnniVariant, true), packed) << "vnni";
}

TEST(Gguf, BlockKernelsMatchTheReferenceOnAwkwardShapes) {
  uint64_t seed = 1;
  for (DType t : {DType::Q8_0, DType::Q4_0}) {
    for (int64_t k : {32, 64, 96, 800}) {
      for (int64_t m : {1, 2, 3, 17}) {
        for (int64_t n : {1, 5, 7, 13}) {
          check_block_gemm(block_case(t, m, n, k, seed));
          seed += 2;
        }
      }
    }
  }
}

TEST(Gguf, ThreadedBlockKernelsMatchOneThread) {
  // Past both fork thresholds (work and bytes streamed) with a ragged last tile; decode (m = 1)
  // forks by bytes alone.
  for (DType t : {DType::Q8_0, DType::Q4_0}) {
    for (int64_t m : {1, 17}) {
      const BlockGemmCase c = block_case(t, m, 601, 800, 100 + uint64_t(m));
      SCOPED_TRACE(std::string(dtype_name(t)) + " m=" + std::to_string(m));
      cpu_backend()->set_threads(4);
      check_block_gemm(c);
      auto l = gguf()->make_linear(*cpu_backend(), {"blk.0.ffn_up.weight", t, c.bytes.data(), c.n, c.k});
      const auto threaded = test::linear_forward(*l, c.x, c.m);
      cpu_backend()->set_threads(1);
      EXPECT_EQ(test::linear_forward(*l, c.x, c.m), threaded);
      // A row of the batch is that row alone (prefill vs decode).
      const std::vector<float> last(c.x.end() - c.k, c.x.end());
      EXPECT_EQ(test::linear_forward(*l, last, 1), std::vector<float>(threaded.end() - c.n, threaded.end()));
    }
  }
  cpu_backend()->set_threads(int(std::max(1u, std::thread::hardware_concurrency())));  // the default again
}

TEST(Gguf, BlockKernelsRefuseAnUnknownVariant) {
  const BlockGemmCase c = block_case(DType::Q4_0, 1, 4, 64, 7);
  try {
    raw_gemm(c, 1);
    FAIL() << "variant 1 accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("q4_0"));
    EXPECT_THAT(e.what(), HasSubstr("variant 1"));
  }
}

TEST(Gguf, Q8PerplexityWithinOnePercentOfTheReference) {
  auto p = test::cpu_pipeline(test::kStoriesQ8, {{"quantizer", {{"plugin", "gguf"}}}});
  const auto tokens = p->tokenizer().encode(test::read_text(test::kShared + "/eval/tiny_stories_eval.txt"), true);
  EXPECT_NEAR(perplexity(*p, tokens, 128).perplexity, 4.7733, 4.7733 * 0.01);
}

TEST(Gguf, Q8GreedyFollowsTheReferenceUpToNearTies) {
  // The reference (llama.cpp) quantizes activations inside its Q8_0 dots, as our kernels do, but
  // not to the same bits (fp16 activation scales, other kernels for the attention and norms, another
  // summation order), so golden/README.md allows a divergence after a near-tie. Where we part from
  // the reference, its token must be within 0.25 nats of ours: the ties met on these prompts are
  // 0.004-0.05 nats apart in the exact f32 forward pass, and 8-bit activations move such gaps by up
  // to ~0.15 nats (measured on these prompts); a wrong kernel parts at a clear choice, nats apart.
  // And most prompts agree for a long stretch.
  auto p = test::cpu_pipeline(test::kStoriesQ8, {{"quantizer", {{"plugin", "gguf"}}}});
  int long_agreements = 0, prompts = 0;
  for (const auto& item : test::read_json(test::kShared + "/golden/stories260K-q8_0.greedy96.json")) {
    const std::vector<int32_t> prompt = item.at("prompt_token_ids");
    const std::vector<int32_t> want = item.at("completion_token_ids");
    SCOPED_TRACE(item.at("prompt").get<std::string>());
    Engine engine(*p);
    GenerationRequest req;
    req.prompt = prompt;
    req.max_tokens = 96;
    SamplingParams greedy;
    greedy.temperature = 0;
    greedy.logprobs = 5;
    req.sampling = greedy;
    engine.submit(std::move(req));
    engine.run_until_idle();
    const auto results = engine.take_finished();
    ASSERT_EQ(results.size(), 1u);
    const GenerationResult& r = results[0];
    size_t same = 0;
    while (same < want.size() && same < r.tokens.size() && r.tokens[same] == want[same]) ++same;
    ++prompts;
    if (same >= 48) ++long_agreements;
    if (same == want.size()) continue;
    ASSERT_LT(same, r.top_logprobs.size());
    const auto& top = r.top_logprobs[same];
    const auto theirs = std::find_if(top.begin(), top.end(), [&](const TokenLogprob& t) { return t.token == want[same]; });
    ASSERT_NE(theirs, top.end()) << "at token " << same << " the reference's " << want[same] << " is not in our top 5";
    EXPECT_LT(r.logprobs[same] - theirs->logprob, 0.25) << "parted from the reference at token " << same
                                                        << " with a clear choice, not a near-tie";
  }
  EXPECT_EQ(prompts, 5);
  EXPECT_GE(long_agreements, 4) << "agree with the reference for 48+ tokens on most prompts";
}

}  // namespace
}  // namespace tessera
