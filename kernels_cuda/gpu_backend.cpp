// The CUDA and HIP backends: device memory through the runtime API plus the kernels built so far.
// One source serves both vendors through vendor.h (TESSERA_HIP selects HIP). Ops not yet ported
// answer false in supports(), so a pipeline needing them is refused at validation by op name.
#include <memory>
#include <string>
#include <vector>

#include "kernels_gpu.h"
#include "tessera/error.h"
#include "tessera/plugin.h"

namespace tessera::gpu {

namespace {

const std::string kBackend = TESSERA_GPU_BACKEND;
#if defined(TESSERA_HIP)
constexpr const char* kDoc = "AMD GPU through HIP (ROCm); so far: memory, add and silu_mul on f32";
#else
constexpr const char* kDoc = "NVIDIA GPU through CUDA; so far: memory, add and silu_mul on f32";
#endif

[[noreturn]] void fail(const std::string& what, cudaError_t status) {
  throw Error(kBackend + " backend: " + what + " failed (" + cudaGetErrorString(status) + ")");
}

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) fail(what, status);
}

// Every device the runtime reports; empty without a driver or a device. Never throws: `tessera
// plugins` and auto backend selection call it on machines with no GPU at all.
std::vector<DeviceInfo> enumerate_devices() {
  std::vector<DeviceInfo> out;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear it so a later call does not report a stale error
    return out;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) {
      (void)cudaGetLastError();
      continue;
    }
    out.push_back(DeviceInfo{i, prop.name, static_cast<size_t>(prop.totalGlobalMem)});
  }
  return out;
}

class GpuBackend final : public Backend {
 public:
  explicit GpuBackend(int device) : device_(device) {
    check(cudaSetDevice(device_), TESSERA_GPU_API "SetDevice");
    // A non-blocking stream of our own, so work never serialises against other libraries' use of
    // the legacy default stream.
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), TESSERA_GPU_API "StreamCreate");
  }
  ~GpuBackend() override {
    if (stream_ != nullptr) {
      (void)cudaSetDevice(device_);
      (void)cudaStreamSynchronize(stream_);
      (void)cudaStreamDestroy(stream_);
    }
  }
  GpuBackend(const GpuBackend&) = delete;
  GpuBackend& operator=(const GpuBackend&) = delete;

  std::string_view name() const override { return kBackend; }
  std::vector<DeviceInfo> devices() const override { return enumerate_devices(); }
  bool supports(Op op, DType dtype) const override {
    switch (op) {
      case Op::add:
      case Op::silu_mul: return dtype == DType::F32;
      default: return false;
    }
  }

  // Memory. Host copies return once the data has landed (as on the CPU backend), so the caller may
  // reuse or read its host buffer at once; device-side work stays asynchronous on the stream.
  void* allocate(size_t bytes) override {
    activate();
    void* p = nullptr;
    const cudaError_t status = cudaMalloc(&p, bytes == 0 ? 1 : bytes);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      throw Error(kBackend + " backend: out of device memory allocating " + std::to_string(bytes) +
                  " bytes on device " + std::to_string(device_) + " (" + TESSERA_GPU_API "Malloc: " +
                  cudaGetErrorString(status) + ")");
    }
    return p;
  }
  void deallocate(void* ptr) noexcept override {
    if (ptr == nullptr) return;
    (void)cudaSetDevice(device_);
    (void)cudaFree(ptr);
  }
  void copy_to_device(void* dst, const void* src, size_t bytes) override {
    activate();
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "copy_to_device");
    check(cudaStreamSynchronize(stream_), "copy_to_device");
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    activate();
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "copy_to_host");
    check(cudaStreamSynchronize(stream_), "copy_to_host");
  }
  void copy_on_device(void* dst, const void* src, size_t bytes) override {
    activate();
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "copy_on_device");
  }
  void fill_zero(void* dst, size_t bytes) override {
    activate();
    check(cudaMemsetAsync(dst, 0, bytes, stream_), "fill_zero");
  }
  void synchronize() override {
    activate();
    check(cudaStreamSynchronize(stream_), "synchronize");
  }

  // Kernels.
  void silu_mul(const float* gate, const float* up, float* out, int64_t n) override {
    activate();
    gpu::silu_mul(gate, up, out, n, stream_);
    check(cudaGetLastError(), "silu_mul launch");
  }
  void add(const float* a, const float* b, float* out, int64_t n) override {
    activate();
    gpu::add(a, b, out, n, stream_);
    check(cudaGetLastError(), "add launch");
  }

  void embedding(const WeightView&, const int32_t*, int64_t, float*) override { missing(Op::embedding); }
  void gemm(const float*, int64_t, const WeightView&, float*) override { missing(Op::gemm); }
  void rms_norm(const float*, const float*, float*, int64_t, int64_t, float) override {
    missing(Op::rms_norm);
  }
  void rope(float*, const int32_t*, int64_t, int64_t, int64_t, int64_t, float, RopeStyle) override {
    missing(Op::rope);
  }
  void softmax(float*, int64_t, int64_t) override { missing(Op::softmax); }
  void kv_write(const KvLayerView&, const float*, const float*, const int32_t*, int64_t) override {
    missing(Op::kv_write);
  }
  void attention(const AttentionArgs&, const KvLayerView&) override { missing(Op::attention); }
  void attention_block_scores(const AttentionArgs&, const KvLayerView&, float*) override {
    missing(Op::sparse_attention);
  }
  void argmax(const float*, int64_t, int64_t, int32_t*) override { missing(Op::argmax); }

 private:
  // The runtime's current device is per host thread, and the engine may call from any thread.
  void activate() const {
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess || current != device_) {
      check(cudaSetDevice(device_), TESSERA_GPU_API "SetDevice");
    }
  }
  [[noreturn]] static void missing(Op op) {
    throw Error(std::string(op_name(op)) + " is not implemented on the " + kBackend + " backend yet");
  }

  int device_ = 0;
  cudaStream_t stream_ = nullptr;
};

std::unique_ptr<Backend> create_backend(const Params& params) {
  const int64_t device = params.get_int("device");
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    const std::string reason = status != cudaSuccess ? cudaGetErrorString(status) : "0 devices";
    throw Error(kBackend + " backend: no " TESSERA_GPU_VENDOR " device available (" TESSERA_GPU_API
                           "GetDeviceCount: " + reason + ")");
  }
  if (device < 0 || device >= count) {
    throw Error(kBackend + " backend: device " + std::to_string(device) + " requested, but " +
                std::to_string(count) + " " TESSERA_GPU_VENDOR " device(s) are present (0.." +
                std::to_string(count - 1) + ")");
  }
  return std::make_unique<GpuBackend>(static_cast<int>(device));
}

void register_gpu(Registrar& r) {
  r.add<Backend>(kBackend, kDoc,
                 {{"device", ParamType::integer, 0, "device index (0 = the first GPU the runtime reports)", {}}},
                 [](const Params& p) { return create_backend(p); });
}

}  // namespace

}  // namespace tessera::gpu

#if defined(TESSERA_HIP)
TESSERA_PLUGIN("kernels_hip", tessera::gpu::register_gpu)
#else
TESSERA_PLUGIN("kernels_cuda", tessera::gpu::register_gpu)
#endif
