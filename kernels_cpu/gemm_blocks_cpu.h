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

// x quantized per block of 32: q [m][k] int8, d [m][k/32] block scales.
struct BlockActivations {
  const int8_t* q;
  const float* d;
  int64_t k;
};

// One tile of four weight rows against x rows [i0, i1): y[i * ldy + r] for r < rows (y points at
// the tile's first column). w: the four rows' starts (row-major; a short tile repeats its last
// row), or for a packed tile its start in w[0]. Each output is computed the same way whatever
// i0, i1 and the layout (so a row of a batch equals that row alone, bit for bit):
//   y[i][r] = Σ_b d_w[r][b] · d_x[i][b] · (q_w[r][b] · q_x[i][b])
// with the int8 dot exact and the sum over blocks in float.
using BlockTileFn = void (*)(const uint8_t* const* w, const BlockActivations& x, int64_t i0, int64_t i1, float* y,
                             int64_t ldy, int64_t rows);

struct BlockKernels {
  const char* name;    // the dtype, for error messages
  size_t block_bytes;  // bytes of one weight block
  BlockTileFn avx2[2]; // [packed]
  BlockTileFn scalar;  // row-major
};

// From this many x rows a tile's blocks are first unpacked into a small per-thread buffer (int8
// and float scales, L1-resident) and every x row reuses it (prefill); fewer rows read the blocks
// in place (decode).
inline constexpr int64_t kBlockBufferRows = 4;

// Stores out[r][q] (q < kx) into y rows i, i+1 (kx = 2) for r < rows.
inline void store_tile(const float (*out)[2], int kx, float* y, int64_t ldy, int64_t rows) {
  for (int q = 0; q < kx; ++q) {
    for (int64_t r = 0; r < rows; ++r) y[q * ldy + r] = out[r][q];
  }
}

// y[m][n] = x[m][k] · W[n][k]ᵀ with the given block kernels. m = 0 only validates the view.
void gemm_blocks(const float* x, int64_t m, const WeightView& w, float* y, const BlockKernels& kernels);

// Whether the AVX2 block kernels can run (AVX2, FMA and F16C for the fp16 block scales).
bool has_avx2_f16c();

void gemm_q8_0(const float* x, int64_t m, const WeightView& w, float* y);
void gemm_q4_0(const float* x, int64_t m, const WeightView& w, float* y);

// Backend::prepare_weight for Q8_0 and Q4_0 (see gemm_blocks_cpu.cpp for the layout).
void prepare_weight_blocks(WeightView& w);

}  // namespace tessera::cpu
