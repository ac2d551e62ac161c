// What the Q8_0 and Q4_0 integer-dot gemms share: activation quantization, the packed tile layout,
// and the walk over tiles and threads (see gemm_blocks_cpu.h).
//
// prepare_weight_blocks() packs the default variant's weights (flag kBlockTilesPacked): each full
// tile of four rows stores its blocks interleaved — row 0 block 0, row 1 block 0, row 2 block 0,
// row 3 block 0, row 0 block 1, ... — so a thread reads its band of W as one sequential stream (with
// a software prefetch ahead of it), which is what lets decode run at memory speed; four rows read
// side by side ran at about half of it. The bytes stay the file's blocks, whole and unchanged (fp16
// scale and quants together); only their order changes. There is no float copy. A last tile of
// fewer than four rows stays row-major.
//
// Before those tiles come whole 8-row bands (flag kBlockBandsPacked): each block of a band holds
// the eight rows' fp16 scales, then each row pair's quants, 16 bytes of one row beside the same 16
// of the other (gemm_blocks_cpu.h), so a block's 8 scales convert in one instruction and each
// register of a row pair is one load; decode of 4-row tiles spent as much on gathering scales and
// halves as on the dot products. Still the file's bytes, each scale and each row's quants
// unchanged; after the bands come a tile (if 4 rows remain) and the rows left, as above.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "gemm_blocks_cpu.h"
#include "stealing_bands_cpu.h"
#include "tessera/error.h"

namespace tessera::cpu {

namespace {

constexpr int64_t kRowsPerTile = 4;  // weight rows sharing each activation load
constexpr int64_t kBlockM = 64;      // x rows kept hot in cache while a thread walks its W rows

// One row of x -> int8 per block of 32, scale d = amax/127 and q = round(x / d) to nearest even
// (llama.cpp's Q8_0 activations; the scale stays float here). The AVX2 version does the same float
// operations, so both produce identical bytes.
void quantize_row_scalar(const float* x, int64_t k, int8_t* q, float* d) {
  for (int64_t b = 0; b < k / kQBlock; ++b) {
    const float* xb = x + b * kQBlock;
    float amax = 0;
    for (int64_t c = 0; c < kQBlock; ++c) amax = std::max(amax, std::fabs(xb[c]));
    const float db = amax / 127.0f;
    const float id = db != 0 ? 1.0f / db : 0.0f;
    for (int64_t c = 0; c < kQBlock; ++c) {
      q[b * kQBlock + c] = static_cast<int8_t>(std::clamp(std::lrintf(xb[c] * id), -128L, 127L));
    }
    d[b] = db;
  }
}

__attribute__((target("avx2,fma"))) void quantize_row_avx2(const float* x, int64_t k, int8_t* q, float* d) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  // packs interleaves 128-bit lanes; this puts the 4-byte groups back in order.
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t b = 0; b < k / kQBlock; ++b) {
    const float* xb = x + b * kQBlock;
    const __m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8), v2 = _mm256_loadu_ps(xb + 16),
                 v3 = _mm256_loadu_ps(xb + 24);
    const __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(abs_mask, v0), _mm256_and_ps(abs_mask, v1)),
                                   _mm256_max_ps(_mm256_and_ps(abs_mask, v2), _mm256_and_ps(abs_mask, v3)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    const float db = _mm_cvtss_f32(m4) / 127.0f;
    const __m256 id = _mm256_set1_ps(db != 0 ? 1.0f / db : 0.0f);
    const __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, id));
    const __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, id));
    const __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, id));
    const __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, id));
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + b * kQBlock), _mm256_permutevar8x32_epi32(p, order));
    d[b] = db;
  }
}

void quantize_rows(const float* x, int64_t i0, int64_t i1, int64_t k, int8_t* xq, float* xd, bool avx2) {
  const int64_t blocks = k / kQBlock;
  for (int64_t i = i0; i < i1; ++i) {
    if (avx2) {
      quantize_row_avx2(x + i * k, k, xq + i * k, xd + i * blocks);
    } else {
      quantize_row_scalar(x + i * k, k, xq + i * k, xd + i * blocks);
    }
  }
}

// Rows [0, bands_end) of a view are stored as 8-row bands.
int64_t bands_end(const WeightView& w) {
  return (w.kernel_variant & kBlockBandsPacked) != 0 ? w.rows / kRowsPerBand * kRowsPerBand : 0;
}

// y rows [0, m) x W rows [j0, j1), with x already quantized. j0 is a multiple of kRowsPerBand.
void gemm_rows(const BlockActivations& x, int64_t m, const WeightView& w, int64_t j0, int64_t j1, float* y,
               const BlockKernels& kern, bool avx2, bool vnni) {
  const int64_t n = w.rows;
  const int64_t row_bytes = (w.cols / kQBlock) * int64_t(kern.block_bytes);
  const auto* base = static_cast<const uint8_t*>(w.data);
  const bool packed = (w.kernel_variant & kBlockTilesPacked) != 0;
  const int64_t banded = bands_end(w);
  for (int64_t ib = 0; ib < m; ib += kBlockM) {
    const int64_t ie = std::min(m, ib + kBlockM);
    for (int64_t j = j0; j < j1; j += kRowsPerTile) {
      if (j < banded) {
        (vnni ? kern.band_vnni : kern.band)(base + j * row_bytes, x, ib, ie, y + ib * n + j, n);
        j += kRowsPerBand - kRowsPerTile;
        continue;
      }
      const int64_t rows = std::min(kRowsPerTile, j1 - j);
      // Packed only where the tile is whole (j1 < n only at a band edge, which is a tile edge).
      const bool tile = packed && rows == kRowsPerTile;
      const uint8_t* wr[kRowsPerTile];
      for (int64_t r = 0; r < kRowsPerTile; ++r) wr[r] = base + (j + std::min(r, rows - 1)) * row_bytes;
      (avx2 ? kern.avx2[tile] : kern.scalar)(wr, x, ib, ie, y + ib * n + j, n, rows);
    }
  }
}

}  // namespace

bool has_avx2_f16c() {
  return has_f16c();  // AVX2 and F16C (unpack_row_cpu.cpp)
}

void prepare_weight_blocks(WeightView& w) {
  // Only the AVX2 and VNNI kernels read packed tiles (the scalar code reads rows); a view is packed
  // once.
  if (!simd_kernel(w.kernel_variant) || !has_avx2_f16c()) return;
  const size_t row_bytes = dtype_row_bytes(w.dtype, w.cols);
  const size_t bb = dtype_block_bytes(w.dtype);
  const size_t blocks = row_bytes / bb;
  auto* data = static_cast<uint8_t*>(const_cast<void*>(w.data));
  std::vector<uint8_t> rows(kRowsPerBand * row_bytes);
  int64_t j = 0;
  // Bands (gemm_blocks_cpu.h): per block, the eight rows' fp16 scales, then per row pair and per
  // 16 bytes of quants, the two rows' chunks side by side.
  constexpr size_t kScale = 2, kChunk = 16;
  const size_t quants = bb - kScale;
  for (; j + kRowsPerBand <= w.rows; j += kRowsPerBand) {
    uint8_t* band = data + size_t(j) * row_bytes;
    std::memcpy(rows.data(), band, rows.size());
    for (size_t b = 0; b < blocks; ++b) {
      uint8_t* dst = band + b * kRowsPerBand * bb;
      for (size_t r = 0; r < size_t(kRowsPerBand); ++r) {
        const uint8_t* src = rows.data() + r * row_bytes + b * bb;
        std::memcpy(dst + r * kScale, src, kScale);
        for (size_t c = 0; c < quants / kChunk; ++c) {
          std::memcpy(dst + kBandScaleBytes + r / 2 * 2 * quants + c * 2 * kChunk + r % 2 * kChunk,
                      src + kScale + c * kChunk, kChunk);
        }
      }
    }
  }
  if (j > 0) w.kernel_variant |= kBlockBandsPacked;
  for (; j + kRowsPerTile <= w.rows; j += kRowsPerTile) {
    uint8_t* tile = data + size_t(j) * row_bytes;
    std::memcpy(rows.data(), tile, size_t(kRowsPerTile) * row_bytes);  // a tile, not a band: the last rows may end here
    for (size_t b = 0; b < blocks; ++b) {
      for (size_t r = 0; r < size_t(kRowsPerTile); ++r) {
        std::memcpy(tile + (b * kRowsPerTile + r) * bb, rows.data() + r * row_bytes + b * bb, bb);
      }
    }
  }
  w.kernel_variant |= kBlockTilesPacked;
}

void gemm_blocks(const float* x, int64_t m, const WeightView& w, float* y, const BlockKernels& kern) {
  const int32_t variant = w.kernel_variant & ~(kBlockTilesPacked | kBlockBandsPacked);
  if (!simd_kernel(variant) && variant != kKernelReference) {
    throw Error("cpu gemm on " + std::string(kern.name) + ": unknown kernel variant " + std::to_string(variant) +
                " (0 = auto, 2 = scalar, 3 = avx2, 4 = vnni)");
  }
  const bool vnni = vnni_for(variant, kern.name) && has_avx2_f16c();
  const bool avx2 = variant != kKernelReference && has_avx2_f16c();
  if ((w.kernel_variant & (kBlockTilesPacked | kBlockBandsPacked)) != 0 && !avx2) {
    throw Error("cpu gemm on " + std::string(kern.name) + ": a view packed into bands and tiles needs the AVX2 kernel");
  }
  const int64_t k = w.cols;
  const int64_t n = w.rows;
  if (k % kQBlock != 0) {
    throw Error("cpu gemm on " + std::string(kern.name) + ": k = " + std::to_string(k) +
                " is not a whole number of 32-element blocks");
  }
  if (m <= 0 || n <= 0) return;
  // Each thread's scratch: x quantized per block.
  struct Scratch {
    std::vector<int8_t> xq;
    std::vector<float> xd;
  };
  thread_local Scratch mine;
  auto quantize = [&](Scratch& s, int64_t i0, int64_t i1) {
    quantize_rows(x, i0, i1, k, s.xq.data(), s.xd.data(), avx2);
  };
  auto size_scratch = [&](Scratch& s) {
    s.xq.resize(size_t(m * k));
    s.xd.resize(size_t(m * (k / kQBlock)));
  };
  size_scratch(mine);
  const int64_t weight_bytes = n * (k / kQBlock) * int64_t(kern.block_bytes);
  if ((m * n * k < kParallelWork && weight_bytes < kParallelStreamBytes) || team_max_threads() == 1) {
    quantize(mine, 0, m);
    gemm_rows({mine.xq.data(), mine.xd.data(), k}, m, w, 0, n, y, kern, avx2, vnni);
    return;
  }
  const int64_t bands = (n + kRowsPerBand - 1) / kRowsPerBand;
  StealingBands units(bands, team_max_threads());
  Scratch* caller = &mine;
  team_run([&](int t, int) {
    const Scratch& s = team_quantized_x(*caller, mine, m, m, size_scratch, quantize);  // slices: rows
    for (UnitRange r; !(r = units.next(t)).empty();) {
      gemm_rows({s.xq.data(), s.xd.data(), k}, m, w, r.begin * kRowsPerBand, std::min(n, r.end * kRowsPerBand), y,
                kern, avx2, vnni);
    }
  });
}

}  // namespace tessera::cpu
