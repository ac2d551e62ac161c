// Kernel launchers shared by the CUDA and HIP backends. The kernels build with nvcc/hipcc as C++17;
// the backend class builds with the host C++ compiler against the SDK. Only plain pointers and
// integers cross between the two, so the device compiler's standard library never meets the SDK's.
//
// Each launcher enqueues on `stream` and returns without synchronising; the caller checks
// cudaGetLastError() so that a failed launch is reported with the op's name.
#pragma once

#include <cstdint>

#include "vendor.h"

namespace tessera::gpu {

// out[i] = a[i] + b[i]
void add(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream);
// out[i] = silu(gate[i]) * up[i]
void silu_mul(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream);

}  // namespace tessera::gpu
