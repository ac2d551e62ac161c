// Integer-dot GEMM on GGUF's 32-element weight blocks (Q8_0, Q4_0), the scheme llama.cpp runs on
// AVX2: each activation row is quantized once per call to int8 in blocks of 32 (scale amax/127,
// like Q8_0), and every block pair costs one int8 dot scaled by d_w·d_x and accumulated in float.
// Not llama.cpp's bits: it stores each activation block's scale as f16 and rounds halves away from
// zero, where these keep the scale in f32 and round to nearest even (~1e-3 relative apart per
// output, an independent numpy check of both found).
// This header is what the two formats share: the walk over tiles and threads, activation
// quantization and the tile packing (gemm_blocks_cpu.cpp), and the AVX2 tile runner and helpers
// (below); the block dots themselves live in gemm_q8_0_cpu.cpp and gemm_q4_0_cpu.cpp.
//
// WeightView::kernel_variant for Q8_0 / Q4_0 on the CPU (the numbers of kernels_cpu.h):
//   0  auto: AVX2 (+FMA, F16C) when the CPU has it, with AVX-512 VNNI's vpdpbusd for the bands
//      (decode and prefill) where it has that too; otherwise portable scalar code
//   2  the scalar code, whatever the CPU (for tests and comparisons)
//   3  AVX2 without VNNI; 4  VNNI for bands (refused where the CPU lacks it)
// plus the flags kBlockBandsPacked and kBlockTilesPacked, set by prepare_weight_blocks().
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels_cpu.h"

namespace tessera::cpu {

inline constexpr int64_t kQBlock = 32;                 // elements per weight and activation block
inline constexpr int32_t kBlockTilesPacked = 1 << 8;   // kernel_variant flag: tiles interleaved
inline constexpr int32_t kBlockBandsPacked = 1 << 9;   // kernel_variant flag: 8-row bands first
inline constexpr int64_t kRowsPerBand = 8;
inline constexpr int64_t kBlockPrefetchBytes = 2048;   // decode prefetch distance, amd tuning (stream_tuning)

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

// Eight weight rows stored as a band (a format's own layout, see prepare_weight_blocks) against x
// rows [i0, i1): y[i * ldy + r] for r < 8, the same sums as BlockTileFn gives for its two tiles.
using BlockBandFn = void (*)(const uint8_t* band, const BlockActivations& x, int64_t i0, int64_t i1, float* y,
                             int64_t ldy);

struct BlockKernels {
  const char* name;    // the dtype, for error messages
  size_t block_bytes;  // bytes of one weight block
  BlockTileFn avx2[2]; // [packed]
  BlockTileFn scalar;  // row-major
  BlockBandFn band;    // AVX2 on bands
  BlockBandFn band_vnni;  // the same with VNNI for a single x row (decode)
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

// ---- AVX2 pieces of the Q8_0 and Q4_0 kernels ---------------------------------------------------
// Both put two weight rows in one register (rows 2p and 2p+1 in its two 128-bit halves), so one
// int32 -> float conversion and one FMA serve two rows, and each x block is duplicated to match.
// Each output's float sum therefore has 4 lanes per row (lane j: elements 4j..4j+3 and
// 16+4j..16+4j+3), whichever way the blocks are read:
//   in place (rows, packed)  decode: the tile's blocks as stored, scales converted per block
//   buffer                   prefill: the tile unpacked once per thread (Format::unpack), reused
// and the same operations in the same order, so results do not depend on the batch.

enum class BlockSource { rows, packed, buffer };

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

__attribute__((target("avx2,fma"))) inline float hsum4(__m128 s) {
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

// A tile kernel's accumulators ([row pair][x row], lanes 0-3 row 2p, lanes 4-7 row 2p+1) to one
// sum per (row, x row).
template <int kX>
__attribute__((target("avx2,fma"))) inline void store_pair_sums(const __m256 (&acc)[2][kX], float (*out)[2]) {
  for (int p = 0; p < 2; ++p) {
    for (int i = 0; i < kX; ++i) {
      out[2 * p][i] = hsum4(_mm256_castps256_ps128(acc[p][i]));
      out[2 * p + 1][i] = hsum4(_mm256_extractf128_ps(acc[p][i], 1));
    }
  }
}

// The four rows' fp16 block scales (blocks at b[0..3]) as four floats: one conversion per tile step.
__attribute__((target("avx2,fma,f16c"))) inline __m128 scales4(const uint8_t* const* b) {
  const uint64_t h = uint64_t(load_u16(b[0])) | uint64_t(load_u16(b[1])) << 16 | uint64_t(load_u16(b[2])) << 32 |
                     uint64_t(load_u16(b[3])) << 48;
  return _mm_cvtph_ps(_mm_cvtsi64_si128(static_cast<long long>(h)));
}

// Block b of the tile's four rows (kBytes per block), and a prefetch of the packed stream ahead.
template <int64_t kBytes, bool kPacked>
inline void block_ptrs(const uint8_t* const* wr, int64_t b, const uint8_t** blk) {
  for (int r = 0; r < 4; ++r) blk[r] = kPacked ? wr[0] + (b * 4 + r) * kBytes : wr[r] + b * kBytes;
  if constexpr (kPacked) {
    const char* next = reinterpret_cast<const char*>(blk[0]) + kBlockPrefetchBytes;
    for (int64_t line = 0; line < 4 * kBytes; line += 64) _mm_prefetch(next + line, _MM_HINT_T0);
  }
}

// In the buffer each row's scale is stored four times, [row 2p x4 | row 2p+1 x4] per pair, so the
// pair's scales are one load.
inline constexpr int64_t kBufferScalesPerBlock = 16;

// The VNNI prefill's unpacked band (Format::unpack_band_vnni, band_rows_vnni): per block and tile,
// two 64-byte lines of the tile's four rows (elements 0-15, then 16-31).
inline constexpr int64_t kVnniTileBlockBytes = 128;

__attribute__((target("avx2,fma"))) inline void store_spread_scales(float* bufd, int64_t b, __m128 d) {
  float s[4];
  _mm_storeu_ps(s, d);
  for (int r = 0; r < 4; ++r) _mm_storeu_ps(bufd + b * kBufferScalesPerBlock + 4 * r, _mm_set1_ps(s[r]));
}

// The scales of row pair p (index = 2b + p) against one x row, [d_w[2p]·d_x x4 | d_w[2p+1]·d_x x4]:
// taken out of sc (lanes 0-3: d_w[r]·d_x) in place, or the buffer's spread d_w times d_x. Same
// products either way.
template <BlockSource kSrc>
__attribute__((target("avx2,fma"))) inline __m256 pair_scale(__m256 sc, __m256 dx, const float* bufd, int64_t index,
                                                              int p) {
  if constexpr (kSrc == BlockSource::buffer) {
    return _mm256_mul_ps(_mm256_loadu_ps(bufd + 8 * index), dx);
  } else {
    const __m256i lanes = p == 0 ? _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1) : _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3);
    return _mm256_permutevar8x32_ps(sc, lanes);
  }
}

// The per-thread buffer a tile is unpacked into (Format::kBufferBlockBytes and
// kBufferScalesPerBlock floats per block).
struct TileBuffer {
  std::vector<uint8_t> q;
  std::vector<float> d;
};

template <class Format>
TileBuffer& tile_buffer(int64_t blocks) {
  thread_local TileBuffer buf;
  buf.q.resize(size_t(blocks * Format::kBufferBlockBytes));
  buf.d.resize(size_t(blocks * kBufferScalesPerBlock));
  return buf;
}

// BlockTileFn for a format: Format::tile<kX, BlockSource> (out[r][i] for the tile's four rows and
// kX x rows) and Format::unpack<kPacked> (the tile into the buffer). `buf` null: blocks read in
// place from wr; otherwise the tile as unpacked there.
template <class Format, BlockSource kInPlace>
void run_tile_rows(const uint8_t* const* wr, const TileBuffer* buf, const BlockActivations& x, int64_t i0, int64_t i1,
                   float* y, int64_t ldy, int64_t rows) {
  const int64_t blocks = x.k / kQBlock;
  const bool buffered = buf != nullptr;
  const uint8_t* bq = buffered ? buf->q.data() : nullptr;
  const float* bd = buffered ? buf->d.data() : nullptr;
  float out[4][2];
  int64_t i = i0;
  for (; i + 2 <= i1; i += 2) {
    const int8_t* xr[2] = {x.q + i * x.k, x.q + (i + 1) * x.k};
    const float* dr[2] = {x.d + i * blocks, x.d + (i + 1) * blocks};
    if (buffered) {
      Format::template tile<2, BlockSource::buffer>(wr, bq, bd, xr, dr, blocks, out);
    } else {
      Format::template tile<2, kInPlace>(wr, nullptr, nullptr, xr, dr, blocks, out);
    }
    store_tile(out, 2, y + (i - i0) * ldy, ldy, rows);
  }
  if (i < i1) {
    const int8_t* xr[1] = {x.q + i * x.k};
    const float* dr[1] = {x.d + i * blocks};
    if (buffered) {
      Format::template tile<1, BlockSource::buffer>(wr, bq, bd, xr, dr, blocks, out);
    } else {
      Format::template tile<1, kInPlace>(wr, nullptr, nullptr, xr, dr, blocks, out);
    }
    store_tile(out, 1, y + (i - i0) * ldy, ldy, rows);
  }
}

template <class Format, bool kPacked>
void run_tile_avx2(const uint8_t* const* wr, const BlockActivations& x, int64_t i0, int64_t i1, float* y,
                   int64_t ldy, int64_t rows) {
  constexpr BlockSource kInPlace = kPacked ? BlockSource::packed : BlockSource::rows;
  if (i1 - i0 < kBlockBufferRows) return run_tile_rows<Format, kInPlace>(wr, nullptr, x, i0, i1, y, ldy, rows);
  TileBuffer& buf = tile_buffer<Format>(x.k / kQBlock);
  Format::template unpack<kPacked>(wr, x.k / kQBlock, buf.q.data(), buf.d.data());
  run_tile_rows<Format, kInPlace>(wr, &buf, x, i0, i1, y, ldy, rows);
}

// y[m][n] = x[m][k] · W[n][k]ᵀ with the given block kernels. m = 0 only validates the view.
void gemm_blocks(const float* x, int64_t m, const WeightView& w, float* y, const BlockKernels& kernels);

// ---- bands ------------------------------------------------------------------------------------
// A band of eight rows (prepare_weight_blocks): per block, the rows' eight fp16 scales (16 bytes),
// then per row pair p (rows 2p, 2p+1) and per 16 bytes c of a row's quants: row 2p's chunk c and
// row 2p+1's chunk c, so each chunk of a pair is one 32-byte load, as tile() holds it in a register.
inline constexpr int64_t kBandScaleBytes = 2 * kRowsPerBand;

// A packed stream's prefetch, `bytes` (one band block) `ahead` bytes on (decode_prefetch_bytes).
inline void prefetch_band_block(const uint8_t* blk, int64_t bytes, int64_t ahead) {
  if (ahead == 0) return;
  const char* next = reinterpret_cast<const char*>(blk) + ahead;
  for (int64_t line = 0; line < bytes; line += 64) _mm_prefetch(next + line, _MM_HINT_T0);
}

// What every row pair of band block b shares against one x row: the block's address (prefetched
// ahead), its eight scales times d_x (lane r: row r) and the x block's elements 0-15 (16-31) in
// both halves.
struct BandStep {
  const uint8_t* blk;
  __m256 sc;
  __m256i xlo, xhi;
};

template <int64_t kBandBlockBytes>
__attribute__((target("avx2,fma,f16c"))) inline BandStep band_step(const uint8_t* band, const int8_t* xq,
                                                                   const float* xd, int64_t b, int64_t ahead) {
  const uint8_t* blk = band + b * kBandBlockBytes;
  prefetch_band_block(blk, kBandBlockBytes, ahead);
  const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk)));
  const int8_t* xb = xq + b * kQBlock;
  return {blk, _mm256_mul_ps(dw, _mm256_set1_ps(xd[b])),
          _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xb))),
          _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xb + 16)))};
}

// Lanes of row pair p's scales out of a band's eight (lane r: row r): [2p x4 | 2p+1 x4].
__attribute__((target("avx2,fma"))) inline __m256i band_pair_lanes(int p) {
  return _mm256_setr_epi32(2 * p, 2 * p, 2 * p, 2 * p, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1);
}

// Tile `half`'s four fp16 scales of a band block, as scales4 gives a tile's.
__attribute__((target("avx2,fma,f16c"))) inline __m128 band_half_scales(const uint8_t* blk, int half) {
  return _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 8 * half)));
}

// A band's accumulators (pair p: lanes 0-3 row 2p, 4-7 row 2p+1) to y[0..8), as store_pair_sums.
__attribute__((target("avx2,fma"))) inline void store_band_sums(const __m256 (&acc)[4], float* y) {
  for (int p = 0; p < 4; ++p) {
    y[2 * p] = hsum4(_mm256_castps256_ps128(acc[p]));
    y[2 * p + 1] = hsum4(_mm256_extractf128_ps(acc[p], 1));
  }
}

// BlockBandFn for a format with Format::band_row (one x row against the band's eight rows) and
// Format::unpack_band_half (tile `half` of the band into the buffer, as Format::unpack stores a
// tile): the same sums as run_tile_avx2 on the band's two tiles, bit for bit.
template <class Format>
void run_band_avx2(const uint8_t* band, const BlockActivations& x, int64_t i0, int64_t i1, float* y, int64_t ldy) {
  const int64_t blocks = x.k / kQBlock;
  if (i1 - i0 == 1) {
    return Format::band_row(band, x.q + i0 * x.k, x.d + i0 * blocks, blocks, y, decode_prefetch_bytes(kBlockPrefetchBytes));
  }
  TileBuffer& buf = tile_buffer<Format>(blocks);
  for (int half = 0; half < 2; ++half) {
    Format::unpack_band_half(band, half, blocks, buf);
    run_tile_rows<Format, BlockSource::packed>(nullptr, &buf, x, i0, i1, y + 4 * half, ldy, 4);
  }
}

// Prefill with VNNI on a band as Format::unpack_band_vnni lays it out: per block, for each of its
// two tiles (rows 4h..4h+3), 64 bytes of the four rows' elements 0-15 (row r in 128-bit lane r) and
// 64 bytes of their elements 16-31, all unsigned (the stored value plus Format::kVnniOffset); the
// tiles' spread scales (store_spread_scales at index 2b + h). x's halves are broadcast to the four
// lanes, so each vpdpbusd gives every int32 lane its quad's products for four rows at once, and the
// offset's products (offset·Σx over the lane's quads, the same for all eight rows) come off once
// per x row and block: the exact lane sums of tile<> and band_row. With the scales times d_x and
// one FMA a lane, in the same order, and each row's four lanes summed by hsum4, every output has
// the bits of tile<>'s. out[r][i]: band row r, x row i.
template <int kX>
__attribute__((target(VNNI_TARGET))) void band_rows_vnni(const uint8_t* buf, const float* bufd, uint8_t offset,
                                                         const int8_t* const* xq, const float* const* xd,
                                                         int64_t blocks, float (*out)[4]) {
  const __m512i off = _mm512_set1_epi8(static_cast<char>(offset));
  __m512 acc[2][kX];
  for (auto& tile : acc) {
    for (auto& a : tile) a = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < blocks; ++b) {
    const auto* w = reinterpret_cast<const __m512i*>(buf + b * 2 * kVnniTileBlockBytes);
    const __m512i wlo[2] = {_mm512_loadu_si512(w), _mm512_loadu_si512(w + 2)};
    const __m512i whi[2] = {_mm512_loadu_si512(w + 1), _mm512_loadu_si512(w + 3)};
    const __m512 dw[2] = {_mm512_loadu_ps(bufd + (2 * b) * kBufferScalesPerBlock),
                          _mm512_loadu_ps(bufd + (2 * b + 1) * kBufferScalesPerBlock)};
#pragma GCC unroll 4
    for (int i = 0; i < kX; ++i) {
      const int8_t* xb = xq[i] + b * kQBlock;
      const __m512i xlo = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xb)));
      const __m512i xhi = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xb + 16)));
      const __m512i offset_dots = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), off, xlo), off, xhi);
      const __m512 dx = _mm512_set1_ps(xd[i][b]);
      for (int h = 0; h < 2; ++h) {
        const __m512i dots = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), wlo[h], xlo), whi[h], xhi);
        acc[h][i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(dots, offset_dots)), _mm512_mul_ps(dw[h], dx),
                                    acc[h][i]);
      }
    }
  }
  for (int h = 0; h < 2; ++h) {
    for (int i = 0; i < kX; ++i) {
      out[4 * h][i] = hsum4(_mm512_extractf32x4_ps(acc[h][i], 0));
      out[4 * h + 1][i] = hsum4(_mm512_extractf32x4_ps(acc[h][i], 1));
      out[4 * h + 2][i] = hsum4(_mm512_extractf32x4_ps(acc[h][i], 2));
      out[4 * h + 3][i] = hsum4(_mm512_extractf32x4_ps(acc[h][i], 3));
    }
  }
}

// run_band_avx2 with VNNI: one x row (decode) through Format::band_row_vnni, a batch through
// band_rows_vnni four x rows at a time, the band unpacked once for all of them. The same int32
// dots and float operations, so the same bits. 128-row prefill from cache, one thread
// (BM_Gemm/4|5/128/{2048/768,768/2048,768/768}, 3 alternating runs per step), AVX2 tiles -> VNNI a
// tile at a time -> both tiles in one pass (x's broadcasts and offset dots shared): Q8_0 4216-4558
// -> 3052-3087 -> 2581-2605 us, 4024-4033 -> 2873-2944 -> 2480-2485, 1582-1688 -> 1144-1150 ->
// 974-984; Q4_0 3447-3454 -> 3027-3031 -> 2566-2597, 3258-3269 -> 2866-2888 -> 2442-2466,
// 1299-1301 -> 1142-1192 -> 966-981.
template <class Format>
void run_band_vnni(const uint8_t* band, const BlockActivations& x, int64_t i0, int64_t i1, float* y, int64_t ldy) {
  const int64_t blocks = x.k / kQBlock;
  if (i1 - i0 == 1) {
    return Format::band_row_vnni(band, x.q + i0 * x.k, x.d + i0 * blocks, blocks, y,
                                 decode_prefetch_bytes(kBlockPrefetchBytes));
  }
  thread_local TileBuffer buf;  // the band as band_rows_vnni reads it
  buf.q.resize(size_t(blocks * 2 * kVnniTileBlockBytes));
  buf.d.resize(size_t(blocks * 2 * kBufferScalesPerBlock));
  Format::unpack_band_vnni(band, blocks, buf);
  using Rows = void (*)(const uint8_t*, const float*, uint8_t, const int8_t* const*, const float* const*, int64_t,
                        float (*)[4]);
  constexpr Rows kRows[5] = {nullptr, band_rows_vnni<1>, band_rows_vnni<2>, band_rows_vnni<3>, band_rows_vnni<4>};
  for (int64_t i = i0; i < i1;) {
    const int kx = int(std::min<int64_t>(4, i1 - i));
    const int8_t* xr[4];
    const float* dr[4];
    for (int q = 0; q < kx; ++q) xr[q] = x.q + (i + q) * x.k, dr[q] = x.d + (i + q) * blocks;
    float out[kRowsPerBand][4];
    kRows[kx](buf.q.data(), buf.d.data(), Format::kVnniOffset, xr, dr, blocks, out);
    for (int q = 0; q < kx; ++q) {
      for (int r = 0; r < kRowsPerBand; ++r) y[(i - i0 + q) * ldy + r] = out[r][q];
    }
    i += kx;
  }
}

// Whether the AVX2 block kernels can run (AVX2, FMA and F16C for the fp16 block scales).
bool has_avx2_f16c();

void gemm_q8_0(const float* x, int64_t m, const WeightView& w, float* y);
void gemm_q4_0(const float* x, int64_t m, const WeightView& w, float* y);

// Backend::prepare_weight for Q8_0 and Q4_0 (see gemm_blocks_cpu.cpp for the layout).
void prepare_weight_blocks(WeightView& w);

}  // namespace tessera::cpu
