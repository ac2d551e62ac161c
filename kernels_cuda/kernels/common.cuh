// Device helpers shared by the kernels: warp/block reductions and element decoding of every weight
// and cache layout. Warp reductions span the whole warp (kWarpSize lanes: 32 on NVIDIA, 32 or 64 on
// AMD), so block sizes are multiples of 64 and every lane of a warp must call them.
#pragma once

#include <cstdint>

#include "../kernels_gpu.h"
#include "gguf_blocks.cuh"

namespace tessera::gpu {

template <class T>
__device__ inline T warp_sum(T v) {
  for (int o = kWarpSize / 2; o > 0; o /= 2) v += shfl_xor(v, o);
  return v;
}

__device__ inline float warp_max(float v) {
  for (int o = kWarpSize / 2; o > 0; o /= 2) v = fmaxf(v, shfl_xor(v, o));
  return v;
}

// Sum or max over the block; every thread gets the result. `scratch` holds one float per warp
// (at most 1024 / 32 = 32). Ends with a barrier, so scratch may be reused right after.
__device__ inline float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = (blockDim.x + kWarpSize - 1) / kWarpSize;
  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0;
  for (int w = 0; w < warps; ++w) total += scratch[w];  // same order in every thread
  __syncthreads();
  return total;
}

__device__ inline float block_max(float v, float* scratch) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = (blockDim.x + kWarpSize - 1) / kWarpSize;
  v = warp_max(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float best = -INFINITY;
  for (int w = 0; w < warps; ++w) best = fmaxf(best, scratch[w]);
  __syncthreads();
  return best;
}

__device__ inline float bf16_bits_to_float(uint16_t h) { return __uint_as_float(uint32_t(h) << 16); }

// Round to nearest even, NaN kept quiet (as tessera::f32_to_bf16).
__device__ inline uint16_t float_to_bf16_bits(float f) {
  uint32_t x = __float_as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40);
  x += 0x7fffu + ((x >> 16) & 1u);
  return uint16_t(x >> 16);
}

// Little-endian 16-bit load from a 2-byte aligned address.
__device__ inline uint16_t load_u16(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }

// Element c of weight row j, as float. Scalar and format-generic: the tiled GEMM and the
// embedding use it; the decode GEMV has vectorised versions below.
__device__ inline float weight_element(const GpuWeight& w, const uint8_t* row, int64_t j, int64_t c) {
  switch (w.format) {
    case WFormat::f32: return reinterpret_cast<const float*>(row)[c];
    case WFormat::f16: return half_bits_to_float(reinterpret_cast<const uint16_t*>(row)[c]);
    case WFormat::bf16: return bf16_bits_to_float(reinterpret_cast<const uint16_t*>(row)[c]);
    case WFormat::q8_0: {
      const uint8_t* blk = row + (c / 32) * 34;
      return half_bits_to_float(load_u16(blk)) * float(int8_t(blk[2 + c % 32]));
    }
    case WFormat::q4_0: {
      const uint8_t* blk = row + (c / 32) * 18;
      const int e = int(c % 32);
      const uint8_t byte = blk[2 + (e % 16)];
      const int q = e < 16 ? (byte & 0x0f) : (byte >> 4);
      return half_bits_to_float(load_u16(blk)) * float(q - 8);
    }
    case WFormat::i4: {
      const uint8_t byte = row[c / 2];
      const int q = (c & 1) ? (byte >> 4) : (byte & 0x0f);
      const int64_t groups = w.cols / w.group_size;
      const int64_t gi = j * groups + c / w.group_size;
      const float zero = w.zeros != nullptr ? w.zeros[gi] : 8.0f;
      return (float(q) - zero) * w.scales[gi];
    }
    case WFormat::q4_1: return gguf::row_element<gguf::Q4_1>(row, c);
    case WFormat::q5_0: return gguf::row_element<gguf::Q5_0>(row, c);
    case WFormat::q5_1: return gguf::row_element<gguf::Q5_1>(row, c);
    case WFormat::iq4_nl: return gguf::row_element<gguf::Iq4Nl>(row, c);
    case WFormat::q2_k: return gguf::row_element<gguf::Q2_K>(row, c);
    case WFormat::q3_k: return gguf::row_element<gguf::Q3_K>(row, c);
    case WFormat::q4_k: return gguf::row_element<gguf::Q4_K>(row, c);
    case WFormat::q5_k: return gguf::row_element<gguf::Q5_K>(row, c);
    case WFormat::q6_k: return gguf::row_element<gguf::Q6_K>(row, c);
    case WFormat::iq4_xs: return gguf::row_element<gguf::Iq4Xs>(row, c);
    case WFormat::iq2_xxs: return gguf::row_element<gguf::Iq2Xxs>(row, c, w.iq_tables);
    case WFormat::iq2_xs: return gguf::row_element<gguf::Iq2Xs>(row, c, w.iq_tables);
    case WFormat::iq2_s: return gguf::row_element<gguf::Iq2S>(row, c, w.iq_tables);
    case WFormat::iq3_xxs: return gguf::row_element<gguf::Iq3Xxs>(row, c, w.iq_tables);
    case WFormat::iq3_s: return gguf::row_element<gguf::Iq3S>(row, c, w.iq_tables);
  }
  return 0.0f;
}

// KV cache element i of a pool of type T, as float.
template <class T> struct CacheElem;
template <> struct CacheElem<float> {
  __device__ static float load(const float* p, int64_t i) { return p[i]; }
  __device__ static float store_value(float v) { return v; }
};
struct Half { uint16_t bits; };
struct BHalf { uint16_t bits; };
template <> struct CacheElem<Half> {
  __device__ static float load(const Half* p, int64_t i) { return half_bits_to_float(p[i].bits); }
  __device__ static Half store_value(float v) { return Half{float_to_half_bits(v)}; }
};
template <> struct CacheElem<BHalf> {
  __device__ static float load(const BHalf* p, int64_t i) { return bf16_bits_to_float(p[i].bits); }
  __device__ static BHalf store_value(float v) { return BHalf{float_to_bf16_bits(v)}; }
};

// Records the first data error of a launch sequence (later ones are dropped).
__device__ inline void report(DeviceStatus* status, int32_t code, int64_t value, int64_t limit) {
  if (atomicCAS(&status->code, kStatusOk, code) == kStatusOk) {
    status->value = value;
    status->limit = limit;
    __threadfence_system();
  }
}

// Grid dimension for `n` independent items of one block each, capped to what every target allows
// (kernels loop when n is larger).
inline unsigned capped_grid(int64_t n, int64_t cap = 65535) {
  return static_cast<unsigned>(n < 1 ? 1 : (n < cap ? n : cap));
}

}  // namespace tessera::gpu
