// The vendor-compatibility header: kernels and the backend class are written once against the CUDA
// runtime API, and a HIP build (TESSERA_HIP defined) maps those names to HIP here. There is no
// hipify/text-rewriting step, so the two backends cannot drift apart (the pattern of ggml's HIP
// build). Add a mapping here when a shared source starts using a new runtime name.
#pragma once

#include <cstdint>

#if defined(TESSERA_HIP)

#ifndef __HIP_PLATFORM_AMD__
#define __HIP_PLATFORM_AMD__ 1
#endif
// Host-only sources (the backend class, built by the C++ compiler) need the runtime API alone;
// device sources (built by hipcc) need the full runtime for __global__, threadIdx and launches.
#if defined(__HIPCC__)
#include <hip/hip_runtime.h>
#else
#include <hip/hip_runtime_api.h>
#endif

#define cudaDeviceProp hipDeviceProp_t
#define cudaError_t hipError_t
#define cudaErrorNoDevice hipErrorNoDevice
#define cudaFree hipFree
#define cudaGetDevice hipGetDevice
#define cudaGetDeviceCount hipGetDeviceCount
#define cudaGetDeviceProperties hipGetDeviceProperties
#define cudaGetErrorString hipGetErrorString
#define cudaGetLastError hipGetLastError
#define cudaFreeHost hipHostFree
#define cudaHostAlloc hipHostMalloc
#define cudaHostAllocMapped hipHostMallocMapped
#define cudaHostGetDevicePointer hipHostGetDevicePointer
#define cudaEvent_t hipEvent_t
#define cudaEventCreate hipEventCreate
#define cudaEventDestroy hipEventDestroy
#define cudaEventElapsedTime hipEventElapsedTime
#define cudaEventRecord hipEventRecord
#define cudaEventSynchronize hipEventSynchronize
#define cudaMalloc hipMalloc
#define cudaMemcpyAsync hipMemcpyAsync
#define cudaMemcpy2DAsync hipMemcpy2DAsync
#define cudaMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define cudaMemcpyDeviceToHost hipMemcpyDeviceToHost
#define cudaMemcpyHostToDevice hipMemcpyHostToDevice
#define cudaMemsetAsync hipMemsetAsync
#define cudaSetDevice hipSetDevice
#define cudaStreamCreateWithFlags hipStreamCreateWithFlags
#define cudaStreamDestroy hipStreamDestroy
#define cudaStreamNonBlocking hipStreamNonBlocking
#define cudaStreamSynchronize hipStreamSynchronize
#define cudaStream_t hipStream_t
#define cudaSuccess hipSuccess

// Wavefront size differs per AMD target (64 on CDNA such as gfx90a, 32 on RDNA such as gfx1100),
// so it is only known in the device pass; the host pass gets the CDNA value and must not size
// launches by it.
#if defined(__HIPCC__)
#include <hip/hip_fp16.h>
#endif

#if defined(__AMDGCN_WAVEFRONT_SIZE)
#define TESSERA_WARP_SIZE __AMDGCN_WAVEFRONT_SIZE
#else
#define TESSERA_WARP_SIZE 64
#endif

#define TESSERA_GPU_BACKEND "hip"
#define TESSERA_GPU_VENDOR "HIP"
#define TESSERA_GPU_API "hip"  // prefix of runtime function names, for error messages

#else  // CUDA

#include <cuda_runtime.h>
#if defined(__CUDACC__)
#include <cuda_fp16.h>
#endif

#define TESSERA_WARP_SIZE 32

#define TESSERA_GPU_BACKEND "cuda"
#define TESSERA_GPU_VENDOR "CUDA"
#define TESSERA_GPU_API "cuda"

#endif

namespace tessera::gpu {

// Threads per warp (wavefront) for the target being compiled; use in device code only.
constexpr int kWarpSize = TESSERA_WARP_SIZE;

}  // namespace tessera::gpu

#if defined(__CUDACC__) || defined(__HIPCC__)
// Device intrinsics whose names or signatures differ between the vendors. Shuffles span the whole
// warp, so every lane must reach them (loops around them have warp-uniform trip counts).
namespace tessera::gpu {

#if defined(TESSERA_HIP)
template <class T>
__device__ inline T shfl_xor(T v, int lane_mask) { return __shfl_xor(v, lane_mask); }
template <class T>
__device__ inline T shfl(T v, int src_lane) { return __shfl(v, src_lane); }
// Four signed 8-bit products summed into c. ROCm 5.2 has no __dp4a; the portable form is exact
// and lets the compiler pick a dot instruction where the target has one.
__device__ inline int dp4a(int a, int b, int c) {
  return c + int(int8_t(a)) * int(int8_t(b)) + int(int8_t(a >> 8)) * int(int8_t(b >> 8)) +
         int(int8_t(a >> 16)) * int(int8_t(b >> 16)) + int(int8_t(a >> 24)) * int(int8_t(b >> 24));
}
#else
template <class T>
__device__ inline T shfl_xor(T v, int lane_mask) { return __shfl_xor_sync(0xffffffffu, v, lane_mask); }
template <class T>
__device__ inline T shfl(T v, int src_lane) { return __shfl_sync(0xffffffffu, v, src_lane); }
__device__ inline int dp4a(int a, int b, int c) { return __dp4a(a, b, c); }
#endif

// IEEE half bits to float and back (round to nearest even), through the vendor's conversions.
__device__ inline float half_bits_to_float(unsigned short h) { return __half2float(__ushort_as_half(h)); }
__device__ inline unsigned short float_to_half_bits(float f) { return __half_as_ushort(__float2half_rn(f)); }

}  // namespace tessera::gpu
#endif
