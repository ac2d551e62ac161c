// GGUF Q4_0 weights (per block of 32: an fp16 scale d_w, then 16 bytes whose low nibbles are
// elements 0-15 and high nibbles elements 16-31, each meaning q - 8) times int8-quantized
// activations. The nibbles are unpacked in registers; the -8 is folded out of the product:
//   Σ (q - 8)·x  =  Σ q·x - Σ 8·x
// so vpmaddubsw takes the unsigned nibbles directly (no sign trick), and 8·x is one vpmaddubsw per
// activation block shared by the four weight rows. Each block is then scaled by d_w·d_x and
// accumulated in float (FMA). The walk over tiles and threads is gemm_blocks (gemm_blocks_cpu.h).
#include <immintrin.h>

#include <cstring>

#include "gemm_blocks_cpu.h"

namespace tessera::cpu {

namespace {

constexpr int64_t kBlockBytes = 18;

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

__attribute__((target("avx2,fma"))) inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

// 16 bytes of nibbles -> 32 bytes 0..15 in element order (low nibbles, then high nibbles).
__attribute__((target("avx2,fma"))) inline __m256i unpack_nibbles(const uint8_t* p, __m256i low_mask) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(bytes, 4), bytes), low_mask);
}

template <int kX, bool kPacked>
__attribute__((target("avx2,fma,f16c"))) void tile_avx2(const uint8_t* const* wr, const int8_t* const* xq,
                                                         const float* const* xd, int64_t blocks, float (*out)[2]) {
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i eights = _mm256_set1_epi8(8);
  const __m256i low_mask = _mm256_set1_epi8(0x0f);
  __m256 acc[4][kX];
  for (auto& row : acc) {
    for (auto& a : row) a = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < blocks; ++b) {
    if constexpr (kPacked) {  // 72 bytes per step
      const char* next = reinterpret_cast<const char*>(wr[0] + b * 4 * kBlockBytes) + kBlockPrefetchBytes;
      _mm_prefetch(next, _MM_HINT_T0);
      _mm_prefetch(next + 64, _MM_HINT_T0);
    }
    __m256i xv[kX], x8[kX];
    __m256 dx[kX];
    for (int i = 0; i < kX; ++i) {
      xv[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[i] + b * kQBlock));
      x8[i] = _mm256_maddubs_epi16(eights, xv[i]);  // pairs of 8·x, <= 2032 in magnitude
      dx[i] = _mm256_set1_ps(xd[i][b]);
    }
    for (int r = 0; r < 4; ++r) {
      const uint8_t* blk = kPacked ? wr[0] + (b * 4 + r) * kBlockBytes : wr[r] + b * kBlockBytes;
      const __m256 dw = _mm256_set1_ps(_cvtsh_ss(load_u16(blk)));
      const __m256i q = unpack_nibbles(blk + 2, low_mask);
      for (int i = 0; i < kX; ++i) {
        // Pairs of q·x are at most 2·15·127 = 3810: no saturation, and neither after subtracting 8·x.
        const __m256i pairs = _mm256_sub_epi16(_mm256_maddubs_epi16(q, xv[i]), x8[i]);
        const __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
        acc[r][i] = _mm256_fmadd_ps(p, _mm256_mul_ps(dw, dx[i]), acc[r][i]);
      }
    }
  }
  for (int r = 0; r < 4; ++r) {
    for (int i = 0; i < kX; ++i) out[r][i] = hsum(acc[r][i]);
  }
}

void tile_scalar(const uint8_t* const* wr, const int8_t* const* xq, const float* const* xd, int64_t blocks,
                 float (*out)[2]) {
  for (int r = 0; r < 4; ++r) {
    float acc = 0;
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* blk = wr[r] + b * kBlockBytes;
      const int8_t* x = xq[0] + b * kQBlock;
      int32_t s = 0;
      for (int c = 0; c < 16; ++c) {
        s += (int32_t(blk[2 + c] & 0x0f) - 8) * int32_t(x[c]);
        s += (int32_t(blk[2 + c] >> 4) - 8) * int32_t(x[c + 16]);
      }
      acc += fp16_to_f32(load_u16(blk)) * xd[0][b] * float(s);
    }
    out[r][0] = acc;
  }
}

const BlockKernels kKernels = {
    "q4_0",
    kBlockBytes,
    {{tile_avx2<1, false>, tile_avx2<1, true>}, {tile_avx2<2, false>, tile_avx2<2, true>}},
    tile_scalar,
};

}  // namespace

void gemm_q4_0(const float* x, int64_t m, const WeightView& w, float* y) { gemm_blocks(x, m, w, y, kKernels); }

}  // namespace tessera::cpu
