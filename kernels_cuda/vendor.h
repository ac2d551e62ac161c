// The vendor-compatibility header: kernels and the backend class are written once against the CUDA
// runtime API, and a HIP build (TESSERA_HIP defined) maps those names to HIP here. There is no
// hipify/text-rewriting step, so the two backends cannot drift apart (the pattern of ggml's HIP
// build). Add a mapping here when a shared source starts using a new runtime name.
#pragma once

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
#define cudaMalloc hipMalloc
#define cudaMemcpyAsync hipMemcpyAsync
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

#define TESSERA_WARP_SIZE 32

#define TESSERA_GPU_BACKEND "cuda"
#define TESSERA_GPU_VENDOR "CUDA"
#define TESSERA_GPU_API "cuda"

#endif

namespace tessera::gpu {

// Threads per warp (wavefront) for the target being compiled; use in device code only.
constexpr int kWarpSize = TESSERA_WARP_SIZE;

}  // namespace tessera::gpu
