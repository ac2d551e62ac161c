// cuBLAS through dlopen (see vendor_blas.h). Only the few entry points used are resolved; a missing
// library or symbol leaves the backend on its own kernels, never half-initialised.
#include <dlfcn.h>

#include <cublas_v2.h>

#include "tessera/error.h"
#include "vendor_blas.h"

namespace tessera::gpu {

namespace {

using CreateFn = cublasStatus_t (*)(cublasHandle_t*);
using DestroyFn = cublasStatus_t (*)(cublasHandle_t);
using SetStreamFn = cublasStatus_t (*)(cublasHandle_t, cudaStream_t);
using SetMathModeFn = cublasStatus_t (*)(cublasHandle_t, cublasMath_t);
using GetVersionFn = cublasStatus_t (*)(cublasHandle_t, int*);
using SetWorkspaceFn = cublasStatus_t (*)(cublasHandle_t, void*, size_t);
using SgemmFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const float*,
                                   const float*, int, const float*, int, const float*, float*, int);
using GemmExFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                                    const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                                    cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);

class Cublas final : public VendorBlas {
 public:
  ~Cublas() override {
    if (handle_ != nullptr) destroy_(handle_);
    if (workspace_ != nullptr) (void)cudaFree(workspace_);
    // The library stays loaded: cuBLAS registers exit handlers and must not be unloaded first.
  }

  static std::unique_ptr<VendorBlas> open(cudaStream_t stream, std::string* why) {
    void* lib = nullptr;
    for (const char* name : {"libcublas.so.13", "libcublas.so.12", "libcublas.so"}) {
      lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (lib != nullptr) break;
    }
    if (lib == nullptr) {
      *why = "libcublas.so not found";
      return nullptr;
    }
    std::unique_ptr<Cublas> b(new Cublas());
    bool ok = true;
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      if (fn == nullptr) {
        ok = false;
        *why = std::string("libcublas lacks ") + name;
      }
    };
    sym(b->create_, "cublasCreate_v2");
    sym(b->destroy_, "cublasDestroy_v2");
    sym(b->set_stream_, "cublasSetStream_v2");
    sym(b->set_math_mode_, "cublasSetMathMode");
    sym(b->get_version_, "cublasGetVersion_v2");
    sym(b->sgemm_, "cublasSgemm_v2");
    sym(b->gemm_ex_, "cublasGemmEx");
    sym(b->set_workspace_, "cublasSetWorkspace_v2");
    if (!ok) return nullptr;
    if (b->create_(&b->handle_) != CUBLAS_STATUS_SUCCESS) {
      b->handle_ = nullptr;
      *why = "cublasCreate failed";
      return nullptr;
    }
    // Full f32 arithmetic (no TF32): the f32 path must agree with the CPU reference to float rounding.
    if (b->set_stream_(b->handle_, stream) != CUBLAS_STATUS_SUCCESS ||
        b->set_math_mode_(b->handle_, CUBLAS_DEFAULT_MATH) != CUBLAS_STATUS_SUCCESS) {
      *why = "cublasSetStream/SetMathMode failed";
      return nullptr;
    }
    // A workspace of our own, so that a GEMM captured into a CUDA graph (launch_queue.h) allocates
    // nothing during the capture; without it cuBLAS uses its default pool.
    if (cudaMalloc(&b->workspace_, kWorkspaceBytes) == cudaSuccess) {
      if (b->set_workspace_(b->handle_, b->workspace_, kWorkspaceBytes) != CUBLAS_STATUS_SUCCESS) {
        (void)cudaFree(b->workspace_);
        b->workspace_ = nullptr;
      }
    } else {
      (void)cudaGetLastError();
      b->workspace_ = nullptr;
    }
    int version = 0;
    b->get_version_(b->handle_, &version);
    b->name_ = "cuBLAS " + std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
               std::to_string(version % 100);
    return b;
  }

  std::string name() const override { return name_; }

  bool gemm_i8(const int8_t* x, int64_t m, const int8_t* w, int64_t n, int64_t k, int32_t* acc) override {
    if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX || k % 4 != 0 || n % 4 != 0) return false;
    const int32_t one = 1, zero = 0;
    return gemm_ex_(handle_, CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(m), int(k), &one, w, CUDA_R_8I, int(k), x, CUDA_R_8I,
                    int(k), &zero, acc, CUDA_R_32I, int(n), CUBLAS_COMPUTE_32I,
                    CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS;
  }

  void gemm(Type type, const void* x, int64_t m, const void* w, int64_t n, int64_t k, float* y) override {
    if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX) throw Error("cuBLAS gemm: dimensions exceed int32");
    // Column-major view of the row-major product: yᵀ[n][m] = W[n][k] · xᵀ[k][m], i.e. op(A) = Wᵀ of
    // the column-major k x n matrix W, B = the column-major k x m matrix x.
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t st;
    if (type == Type::f32) {
      st = sgemm_(handle_, CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(m), int(k), &one, static_cast<const float*>(w),
                  int(k), static_cast<const float*>(x), int(k), &zero, y, int(n));
    } else {
      const cudaDataType t = type == Type::f16 ? CUDA_R_16F : CUDA_R_16BF;
      st = gemm_ex_(handle_, CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(m), int(k), &one, w, t, int(k), x, t, int(k), &zero,
                    y, CUDA_R_32F, int(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    }
    if (st != CUBLAS_STATUS_SUCCESS) {
      throw Error("cuda backend: cuBLAS gemm (m=" + std::to_string(m) + ", n=" + std::to_string(n) + ", k=" +
                  std::to_string(k) + ") failed with status " + std::to_string(int(st)));
    }
  }

 private:
  Cublas() = default;

  CreateFn create_ = nullptr;
  DestroyFn destroy_ = nullptr;
  SetStreamFn set_stream_ = nullptr;
  SetMathModeFn set_math_mode_ = nullptr;
  GetVersionFn get_version_ = nullptr;
  SgemmFn sgemm_ = nullptr;
  GemmExFn gemm_ex_ = nullptr;
  SetWorkspaceFn set_workspace_ = nullptr;
  static constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // what cuBLAS suggests for Hopper
  void* workspace_ = nullptr;
  cublasHandle_t handle_ = nullptr;
  std::string name_;
};

}  // namespace

std::unique_ptr<VendorBlas> VendorBlas::open(cudaStream_t stream, std::string* why) {
  return Cublas::open(stream, why);
}

}  // namespace tessera::gpu
