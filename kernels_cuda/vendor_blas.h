// The vendor BLAS behind large float GEMMs on CUDA (cuBLAS). It is opened with dlopen when a backend
// is created, not linked: the backend library must load on machines without a driver or toolkit,
// and libcublas is a 50 MB shared library (there is no static cuBLAS in the toolkit we build with).
// Without it the backend runs its own GEMM kernels for every shape, and says so in its device name.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "vendor.h"

namespace tessera::gpu {

class VendorBlas {
 public:
  enum class Type { f32, f16, bf16 };

  virtual ~VendorBlas() = default;
  // Opens the library and a handle bound to `stream`; null with `why` filled when unavailable.
  static std::unique_ptr<VendorBlas> open(cudaStream_t stream, std::string* why);

  virtual std::string name() const = 0;  // e.g. "cuBLAS 13.0.0"
  // Row-major y[m][n] = x[m][k] · w[n][k]ᵀ, x and w both of `type`, y float, accumulation in f32
  // (no TF32 for f32 inputs). Throws tessera::Error naming the failing call.
  virtual void gemm(Type type, const void* x, int64_t m, const void* w, int64_t n, int64_t k, float* y) = 0;
  // Row-major int32 acc[m][n] = x[m][k] · w[n][k]ᵀ over int8, exact; false (nothing launched) for a
  // shape or alignment the library refuses, so the caller can run its own kernel instead.
  virtual bool gemm_i8(const int8_t* x, int64_t m, const int8_t* w, int64_t n, int64_t k, int32_t* acc) = 0;
};

}  // namespace tessera::gpu
