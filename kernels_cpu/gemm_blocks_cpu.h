// Integer-dot GEMM on GGUF's 32-element weight blocks (Q8_0, Q4_0), as llama.cpp runs them on
// AVX2: each activation row is quantized once per call to int8 in blocks of 32 (scale amax/127,
// like Q8_0), and every block pair costs one int8 dot scaled by d_w·d_x and accumulated in float.
// This header is what the two formats share (gemm_blocks_cpu.cpp: activation quantization, the
// tile packing, threading); the block dots live in gemm_q8_0_cpu.cpp and gemm_q4_0_cpu.cpp.
//
// WeightView::kernel_variant for Q8_0 / Q4_0 on the CPU:
//   0  the default: AVX2 (+FMA, F16C) when the CPU has it, otherwise portable scalar code
//   2  the scalar code, whatever the CPU (for tests and comparisons; same number as the i8 gemm's)
// plus the flag kBlockTilesPacked, set by prepare_weight_blocks().
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels_cpu.h"

namespace tessera::cpu {

inline constexpr int64_t kQBlock = 32;                 // elements per weight and activation block
inline constexpr int32_t kBlockTilesPacked = 1 << 8;   // kernel_variant flag: tiles interleaved
inline constexpr int64_t kBlockPrefetchBytes = 2048;   // prefetch distance in a packed stream

// One tile of four weight rows against kx (1 or 2) quantized activation rows:
//   out[r][i] = Σ_b d_w[r][b] · d_x[i][b] · (q_w[r][b] · q_x[i][b])
// w: the four rows' starts (row-major; a short tile repeats its last row), or for a packed tile
// its start in w[0]. xq[i]: the row's int8 values; xd[i]: its block scales.
using BlockTileFn = void (*)(const uint8_t* const* w, const int8_t* const* xq, const float* const* xd,
                             int64_t blocks, float (*out)[2]);

struct BlockKernels {
  const char* name;       // the dtype, for error messages
  size_t block_bytes;     // bytes of one weight block
  BlockTileFn avx2[2][2]; // [kx - 1][packed]
  BlockTileFn scalar;     // kx = 1, row-major
};

// y[m][n] = x[m][k] · W[n][k]ᵀ with the given block kernels. m = 0 only validates the view.
void gemm_blocks(const float* x, int64_t m, const WeightView& w, float* y, const BlockKernels& kernels);

// Whether the AVX2 block kernels can run (AVX2, FMA and F16C for the fp16 block scales).
bool has_avx2_f16c();

void gemm_q8_0(const float* x, int64_t m, const WeightView& w, float* y);
void gemm_q4_0(const float* x, int64_t m, const WeightView& w, float* y);

// Backend::prepare_weight for Q8_0 and Q4_0 (see gemm_blocks_cpu.cpp for the layout).
void prepare_weight_blocks(WeightView& w);

}  // namespace tessera::cpu
