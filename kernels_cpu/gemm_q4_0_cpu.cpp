// GGUF Q4_0 weights (per block of 32: an fp16 scale d_w, then 16 bytes whose low nibbles are
// elements 0-15 and high nibbles elements 16-31, each meaning q - 8) times int8-quantized
// activations. The nibbles are unpacked in registers; the -8 is folded out of the product:
//   Σ (q - 8)·x  =  Σ q·x - Σ 8·x
// so vpmaddubsw takes the unsigned nibbles directly (no sign trick), and 8·x is computed once per
// activation block for the whole tile. Each block is then scaled by d_w·d_x and accumulated in
// float (FMA). Two weight rows share a register: the 16 nibble bytes of rows r and r+1 side by side,
// so one mask/shift unpacks both and one vpmaddwd/convert/FMA serves both; their sums land in the
// two 128-bit halves of one accumulator. Two activation rows share each weight load.
// Decode reads the blocks in place; prefill (kBlockBufferRows x rows or more) first unpacks a tile's
// nibbles and scales into a per-thread buffer that every x row reuses. The walk over tiles and
// threads is gemm_blocks (gemm_blocks_cpu.h).
#include <immintrin.h>

#include <cstring>
#include <vector>

#include "gemm_blocks_cpu.h"

namespace tessera::cpu {

namespace {

constexpr int64_t kBlockBytes = 18;
constexpr int64_t kBufferBlockBytes = 2 * 2 * 32;  // a tile's block in the buffer: 2 row pairs x (lo, hi)

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

// The four rows' fp16 block scales (blocks at b[0..3]) as four floats: one conversion for the tile.
__attribute__((target("avx2,fma,f16c"))) inline __m128 scales4(const uint8_t* const* b) {
  const uint64_t h = uint64_t(load_u16(b[0])) | uint64_t(load_u16(b[1])) << 16 | uint64_t(load_u16(b[2])) << 32 |
                     uint64_t(load_u16(b[3])) << 48;
  return _mm_cvtph_ps(_mm_cvtsi64_si128(static_cast<long long>(h)));
}

template <bool kPacked>
inline void block_ptrs(const uint8_t* const* wr, int64_t b, const uint8_t** blk) {
  for (int r = 0; r < 4; ++r) blk[r] = kPacked ? wr[0] + (b * 4 + r) * kBlockBytes : wr[r] + b * kBlockBytes;
}

template <bool kPacked>
inline void prefetch_ahead(const uint8_t* blk0) {
  if constexpr (kPacked) {  // 72 bytes per step
    const char* next = reinterpret_cast<const char*>(blk0) + kBlockPrefetchBytes;
    _mm_prefetch(next, _MM_HINT_T0);
    _mm_prefetch(next + 64, _MM_HINT_T0);
  }
}

// Rows 2p and 2p+1 of a tile's block: their low nibbles (elements 0-15) in lo, high nibbles
// (elements 16-31) in hi, row 2p in the low 128-bit half.
__attribute__((target("avx2,fma"))) inline void unpack_pair(const uint8_t* a, const uint8_t* b, __m256i& lo,
                                                            __m256i& hi) {
  const __m256i low_mask = _mm256_set1_epi8(0x0f);
  const __m256i q = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + 2))),
                                            _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2)), 1);
  lo = _mm256_and_si256(q, low_mask);
  hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low_mask);
}

enum class Source { rows, packed, buffer };

// The scales of row pair p against one x row, [d_w[2p]·d_x x4 | d_w[2p+1]·d_x x4]: taken out of
// sc (lanes 0-3: d_w[r]·d_x) in place, or the buffer's spread-out d_w times d_x. Same products.
template <Source kSrc>
__attribute__((target("avx2,fma"))) inline __m256 pair_scale(__m256 sc, __m256 dx, const float* spread, int64_t pair,
                                                              __m256i index) {
  if constexpr (kSrc == Source::buffer) {
    return _mm256_mul_ps(_mm256_loadu_ps(spread + 8 * pair), dx);
  } else {
    return _mm256_permutevar8x32_ps(sc, index);
  }
}

// out[r][i] for the tile's four rows and kX x rows. From the blocks in place (rows, packed) or from
// the tile unpacked by unpack_tile (buffer); the arithmetic is the same.
template <int kX, Source kSrc>
__attribute__((target("avx2,fma,f16c"))) void tile_avx2(const uint8_t* const* wr, const uint8_t* buf, const float* bufd,
                                                         const int8_t* const* xq, const float* const* xd,
                                                         int64_t blocks, float (*out)[2]) {
  constexpr bool kPacked = kSrc == Source::packed;
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i eights = _mm256_set1_epi8(8);
  const __m256i pair_index[2] = {_mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1), _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3)};
  __m256 acc[2][kX];  // [row pair][x row]: lanes 0-3 row 2p, lanes 4-7 row 2p+1
  for (auto& row : acc) {
    for (auto& a : row) a = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk[4];
    __m256 dw;
    if constexpr (kSrc == Source::buffer) {
      dw = _mm256_setzero_ps();  // unused: the buffer holds each pair's scales spread out
    } else {
      block_ptrs<kPacked>(wr, b, blk);
      prefetch_ahead<kPacked>(blk[0]);
      dw = _mm256_zextps128_ps256(scales4(blk));
    }
    // The activation block duplicated to match the pairs: elements 0-15 in both halves (against
    // the low nibbles), elements 16-31 in both halves (against the high nibbles).
    __m256i xlo[kX], xhi[kX], x8[kX];
    __m256 sc[kX], dx[kX];
    for (int i = 0; i < kX; ++i) {
      const int8_t* xb = xq[i] + b * kQBlock;
      xlo[i] = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xb)));
      xhi[i] = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xb + 16)));
      // Pairs of 8·x over both halves, <= 4064 in magnitude.
      x8[i] = _mm256_add_epi16(_mm256_maddubs_epi16(eights, xlo[i]), _mm256_maddubs_epi16(eights, xhi[i]));
      dx[i] = _mm256_set1_ps(xd[i][b]);
      if constexpr (kSrc != Source::buffer) sc[i] = _mm256_mul_ps(dw, dx[i]);  // lanes 0-3: d_w[r]·d_x
    }
    for (int p = 0; p < 2; ++p) {
      __m256i lo, hi;
      if constexpr (kSrc == Source::buffer) {
        const uint8_t* q = buf + b * kBufferBlockBytes + p * 64;
        lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
        hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32));
      } else {
        unpack_pair(blk[2 * p], blk[2 * p + 1], lo, hi);
      }
      for (int i = 0; i < kX; ++i) {
        // Pairs q·x are at most 2·15·127 = 3810; two of them, less 8·x, stay far inside int16.
        const __m256i pairs = _mm256_sub_epi16(
            _mm256_add_epi16(_mm256_maddubs_epi16(lo, xlo[i]), _mm256_maddubs_epi16(hi, xhi[i])), x8[i]);
        const __m256 d = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
        acc[p][i] = _mm256_fmadd_ps(d, pair_scale<kSrc>(sc[i], dx[i], bufd, 2 * b + p, pair_index[p]), acc[p][i]);
      }
    }
  }
  for (int p = 0; p < 2; ++p) {
    for (int i = 0; i < kX; ++i) {
      out[2 * p][i] = hsum4(_mm256_castps256_ps128(acc[p][i]));
      out[2 * p + 1][i] = hsum4(_mm256_extractf128_ps(acc[p][i], 1));
    }
  }
}

// The tile's blocks as tile_avx2<Source::buffer> reads them: per block and row pair, lo then hi;
// the scales as floats, each row's four times ([row 2p x4 | row 2p+1 x4] per pair).
template <bool kPacked>
__attribute__((target("avx2,fma,f16c"))) void unpack_tile(const uint8_t* const* wr, int64_t blocks, uint8_t* buf,
                                                           float* bufd) {
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk[4];
    block_ptrs<kPacked>(wr, b, blk);
    prefetch_ahead<kPacked>(blk[0]);
    float d[4];
    _mm_storeu_ps(d, scales4(blk));
    for (int r = 0; r < 4; ++r) _mm_storeu_ps(bufd + 8 * (2 * b + r / 2) + 4 * (r % 2), _mm_set1_ps(d[r]));
    for (int p = 0; p < 2; ++p) {
      __m256i lo, hi;
      unpack_pair(blk[2 * p], blk[2 * p + 1], lo, hi);
      uint8_t* q = buf + b * kBufferBlockBytes + p * 64;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), lo);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 32), hi);
    }
  }
}

template <bool kPacked>
void run_tile_avx2(const uint8_t* const* wr, const BlockActivations& x, int64_t i0, int64_t i1, float* y,
                   int64_t ldy, int64_t rows) {
  constexpr Source kInPlace = kPacked ? Source::packed : Source::rows;
  const int64_t blocks = x.k / kQBlock;
  const bool buffered = i1 - i0 >= kBlockBufferRows;
  thread_local std::vector<uint8_t> buf;
  thread_local std::vector<float> bufd;
  if (buffered) {
    buf.resize(size_t(blocks * kBufferBlockBytes));
    bufd.resize(size_t(blocks * 16));
    unpack_tile<kPacked>(wr, blocks, buf.data(), bufd.data());
  }
  float out[4][2];
  int64_t i = i0;
  for (; i + 2 <= i1; i += 2) {
    const int8_t* xr[2] = {x.q + i * x.k, x.q + (i + 1) * x.k};
    const float* dr[2] = {x.d + i * blocks, x.d + (i + 1) * blocks};
    if (buffered) {
      tile_avx2<2, Source::buffer>(wr, buf.data(), bufd.data(), xr, dr, blocks, out);
    } else {
      tile_avx2<2, kInPlace>(wr, nullptr, nullptr, xr, dr, blocks, out);
    }
    store_tile(out, 2, y + (i - i0) * ldy, ldy, rows);
  }
  if (i < i1) {
    const int8_t* xr[1] = {x.q + i * x.k};
    const float* dr[1] = {x.d + i * blocks};
    if (buffered) {
      tile_avx2<1, Source::buffer>(wr, buf.data(), bufd.data(), xr, dr, blocks, out);
    } else {
      tile_avx2<1, kInPlace>(wr, nullptr, nullptr, xr, dr, blocks, out);
    }
    store_tile(out, 1, y + (i - i0) * ldy, ldy, rows);
  }
}

// Portable code, row-major blocks: the same exact int dots, summed over blocks in another order.
void run_tile_scalar(const uint8_t* const* wr, const BlockActivations& x, int64_t i0, int64_t i1, float* y,
                     int64_t ldy, int64_t rows) {
  const int64_t blocks = x.k / kQBlock;
  for (int64_t i = i0; i < i1; ++i) {
    for (int64_t r = 0; r < rows; ++r) {
      float acc = 0;
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* blk = wr[r] + b * kBlockBytes;
        const int8_t* xb = x.q + i * x.k + b * kQBlock;
        int32_t s = 0;
        for (int c = 0; c < 16; ++c) {
          s += (int32_t(blk[2 + c] & 0x0f) - 8) * int32_t(xb[c]);
          s += (int32_t(blk[2 + c] >> 4) - 8) * int32_t(xb[c + 16]);
        }
        acc += fp16_to_f32(load_u16(blk)) * x.d[i * blocks + b] * float(s);
      }
      y[(i - i0) * ldy + r] = acc;
    }
  }
}

const BlockKernels kKernels = {"q4_0", kBlockBytes, {run_tile_avx2<false>, run_tile_avx2<true>}, run_tile_scalar};

}  // namespace

void gemm_q4_0(const float* x, int64_t m, const WeightView& w, float* y) { gemm_blocks(x, m, w, y, kKernels); }

}  // namespace tessera::cpu
