// The CUDA and HIP backends, loaded through the real plugin loader. Without a device (CI, laptops)
// they must still load, list no devices and refuse creation with a clear message; with a device,
// their kernels are checked against a CPU computation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "tessera/backend.h"
#include "tessera/error.h"
#include "tessera/registry.h"

namespace tessera {
namespace {

struct GpuCase {
  const char* backend;   // registered name
  const char* library;   // file in TESSERA_PLUGIN_DIR
  const char* no_device; // what the refusal must say
};

std::string case_name(const testing::TestParamInfo<GpuCase>& info) { return info.param.backend; }
void PrintTo(const GpuCase& c, std::ostream* os) { *os << c.backend; }

class GpuBackendTest : public testing::TestWithParam<GpuCase> {
 protected:
  void SetUp() override {
    path_ = std::filesystem::path(TESSERA_PLUGIN_DIR) / GetParam().library;
    if (!std::filesystem::exists(path_)) {
      GTEST_SKIP() << path_ << " was not built (configure with TESSERA_" << GetParam().backend
                   << "=ON and its compiler installed)";
    }
  }

  Registry& registry() {
    if (!loaded_) registry_.load_library(path_);
    loaded_ = true;
    return registry_;
  }

  // The backend on device 0, or nullptr after checking the refusal when the machine has none.
  std::shared_ptr<Backend> create_or_check_refusal() {
    try {
      return registry().create<Backend>(GetParam().backend, nlohmann::json::object(), "test");
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(GetParam().no_device), std::string::npos) << e.what();
      return nullptr;
    }
  }

  std::filesystem::path path_;
  Registry registry_;
  bool loaded_ = false;
};

TEST_P(GpuBackendTest, RegistersBackendWithDeviceAndGraphsParams) {
  const PluginEntry* entry = registry().find(ComponentKind::backend, GetParam().backend);
  ASSERT_NE(entry, nullptr);
  EXPECT_EQ(std::filesystem::path(entry->library).filename(), path_.filename());
  ASSERT_EQ(entry->params.size(), 2u);
  EXPECT_EQ(entry->params[0].name, "device");
  EXPECT_EQ(entry->params[0].default_value, 0);
  EXPECT_EQ(entry->params[1].name, "graphs");
  EXPECT_EQ(entry->params[1].default_value, true);
}

TEST_P(GpuBackendTest, WithoutDeviceCreationIsRefusedClearly) {
  auto backend = create_or_check_refusal();
  if (backend != nullptr) GTEST_SKIP() << "a " << GetParam().backend << " device is present";
  SUCCEED();
}

// The way `tessera run` meets the refusal: the registry (and with it the library) is gone by the
// time the error is caught and printed, so the exception must not depend on the library's code.
TEST_P(GpuBackendTest, RefusalOutlivesTheLibrary) {
  std::string message;
  try {
    Registry local;
    local.load_library(path_);
    (void)local.create<Backend>(GetParam().backend, nlohmann::json::object(), "test");
  } catch (const Error& e) {
    message = e.what();
  }
  if (message.empty()) GTEST_SKIP() << "a " << GetParam().backend << " device is present";
  EXPECT_NE(message.find(GetParam().no_device), std::string::npos) << message;
}

TEST_P(GpuBackendTest, OutOfRangeDeviceIsRefused) {
  EXPECT_THROW(registry().create<Backend>(GetParam().backend, nlohmann::json{{"device", 1000}}, "test"),
               Error);
}

// supports() answers for every op the kernels implement, and refuses what they do not (int32
// weights, int8/int4 tables for embedding, quantized caches).
TEST_P(GpuBackendTest, SupportsExactlyTheImplementedOps) {
  auto backend = create_or_check_refusal();
  if (backend == nullptr) GTEST_SKIP() << "no " << GetParam().backend << " device on this machine";
  EXPECT_EQ(backend->name(), GetParam().backend);
  EXPECT_FALSE(backend->devices().empty());
  for (Op op : {Op::rms_norm, Op::rope, Op::silu_mul, Op::add, Op::softmax, Op::argmax, Op::gelu_mul, Op::add_rows,
                Op::scale, Op::rope_freqs}) {
    EXPECT_TRUE(backend->supports(op, DType::F32)) << op_name(op);
    EXPECT_FALSE(backend->supports(op, DType::F16)) << op_name(op);
  }
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1,
                 DType::IQ4_NL, DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_XS,
                 DType::IQ2_XXS, DType::IQ2_XS, DType::IQ2_S, DType::IQ3_XXS, DType::IQ3_S}) {
    EXPECT_TRUE(backend->supports(Op::gemm, t)) << dtype_name(t);
    EXPECT_TRUE(backend->supports(Op::embedding, t)) << dtype_name(t);
  }
  EXPECT_TRUE(backend->supports(Op::gemm, DType::I8));
  EXPECT_TRUE(backend->supports(Op::gemm, DType::I4));
  EXPECT_FALSE(backend->supports(Op::gemm, DType::I32));
  EXPECT_FALSE(backend->supports(Op::embedding, DType::I8));
  for (Op op : {Op::kv_write, Op::attention, Op::sparse_attention}) {
    for (DType t : {DType::F32, DType::F16, DType::BF16}) EXPECT_TRUE(backend->supports(op, t)) << op_name(op);
    EXPECT_FALSE(backend->supports(op, DType::I8)) << op_name(op);
  }
}

// Runs a binary elementwise op on the device with the output poisoned first, so a kernel that
// skips elements cannot pass by reading stale memory.
template <class Op>
std::vector<float> run_binary(Backend& backend, const std::vector<float>& a,
                              const std::vector<float>& b, Op op) {
  const size_t bytes = a.size() * sizeof(float);
  void* da = backend.allocate(bytes);
  void* db = backend.allocate(bytes);
  void* dout = backend.allocate(bytes);
  backend.copy_to_device(da, a.data(), bytes);
  backend.copy_to_device(db, b.data(), bytes);
  const std::vector<float> poison(a.size(), std::nanf(""));
  backend.copy_to_device(dout, poison.data(), bytes);
  op(static_cast<const float*>(da), static_cast<const float*>(db), static_cast<float*>(dout),
     static_cast<int64_t>(a.size()));
  backend.synchronize();
  std::vector<float> out(a.size());
  backend.copy_to_host(out.data(), dout, bytes);
  backend.deallocate(da);
  backend.deallocate(db);
  backend.deallocate(dout);
  return out;
}

std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-8.0f, 8.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

TEST_P(GpuBackendTest, AddAndSiluMulMatchCpu) {
  auto backend = create_or_check_refusal();
  if (backend == nullptr) GTEST_SKIP() << "no " << GetParam().backend << " device on this machine";
  // Sizes around the block size and one past it, plus a size larger than one grid covers.
  for (size_t n : {size_t{1}, size_t{255}, size_t{257}, size_t{65535 * 256 + 3}}) {
    const auto a = random_values(n, 1 + static_cast<uint32_t>(n));
    const auto b = random_values(n, 2 + static_cast<uint32_t>(n));
    const auto sum = run_binary(*backend, a, b, [&](const float* x, const float* y, float* o, int64_t k) {
      backend->add(x, y, o, k);
    });
    const auto swiglu = run_binary(*backend, a, b, [&](const float* x, const float* y, float* o, int64_t k) {
      backend->silu_mul(x, y, o, k);
    });
    size_t bad_add = 0, bad_silu = 0;
    for (size_t i = 0; i < n; ++i) {
      if (sum[i] != a[i] + b[i]) ++bad_add;  // one IEEE add: exact
      const float ref = a[i] / (1.0f + std::exp(-a[i])) * b[i];
      if (!(std::fabs(swiglu[i] - ref) <= 1e-5f * (1.0f + std::fabs(ref)))) ++bad_silu;
    }
    EXPECT_EQ(bad_add, 0u) << "add, n=" << n;
    EXPECT_EQ(bad_silu, 0u) << "silu_mul, n=" << n;
  }
  // n = 0 is a no-op, not a launch error.
  backend->add(nullptr, nullptr, nullptr, 0);
  backend->synchronize();
}

INSTANTIATE_TEST_SUITE_P(Gpu, GpuBackendTest,
                         testing::Values(GpuCase{"cuda", "libtessera_kernels_cuda.so", "no CUDA device"},
                                         GpuCase{"hip", "libtessera_kernels_hip.so", "no HIP device"}),
                         case_name);

}  // namespace
}  // namespace tessera
