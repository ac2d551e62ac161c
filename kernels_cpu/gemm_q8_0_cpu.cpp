// GGUF Q8_0 weights (per block of 32: an fp16 scale d_w, then 32 int8 quants) times int8-quantized
// activations: each block pair is one signed int8 dot, scaled by d_w·d_x and accumulated in float
// (FMA). Four weight rows share each activation load; two activation rows share each weight load
// (prefill). The walk over tiles and threads is gemm_blocks (gemm_blocks_cpu.h).
#include <immintrin.h>

#include <cstring>

#include "gemm_blocks_cpu.h"

namespace tessera::cpu {

namespace {

constexpr int64_t kBlockBytes = 34;

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

// Σ over 32 products of two int8 vectors, as 8 int32 pair sums. vpmaddubsw wants one unsigned
// operand: it gets |w| and x carries the sign of w (as llama.cpp does). |x| <= 127 by construction
// and |w| <= 128 (vpabsb of -128 reads as 128 unsigned), so a pair is at most 2·128·127 = 32512 and
// the int16 step cannot saturate, even for a file holding -128.
__attribute__((target("avx2,fma"))) inline __m256i dot32(__m256i aw, __m256i w, __m256i x, __m256i ones) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(x, w)), ones);
}

template <int kX, bool kPacked>
__attribute__((target("avx2,fma,f16c"))) void tile_avx2(const uint8_t* const* wr, const int8_t* const* xq,
                                                         const float* const* xd, int64_t blocks, float (*out)[2]) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[4][kX];
  for (auto& row : acc) {
    for (auto& a : row) a = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < blocks; ++b) {
    if constexpr (kPacked) {  // 136 bytes per step: three lines
      const char* next = reinterpret_cast<const char*>(wr[0] + b * 4 * kBlockBytes) + kBlockPrefetchBytes;
      _mm_prefetch(next, _MM_HINT_T0);
      _mm_prefetch(next + 64, _MM_HINT_T0);
      _mm_prefetch(next + 128, _MM_HINT_T0);
    }
    __m256i xv[kX];
    __m256 dx[kX];
    for (int i = 0; i < kX; ++i) {
      xv[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[i] + b * kQBlock));
      dx[i] = _mm256_set1_ps(xd[i][b]);
    }
    for (int r = 0; r < 4; ++r) {
      const uint8_t* blk = kPacked ? wr[0] + (b * 4 + r) * kBlockBytes : wr[r] + b * kBlockBytes;
      const __m256 dw = _mm256_set1_ps(_cvtsh_ss(load_u16(blk)));
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
      const __m256i aw = _mm256_abs_epi8(w);
      for (int i = 0; i < kX; ++i) {
        const __m256 p = _mm256_cvtepi32_ps(dot32(aw, w, xv[i], ones));
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
      for (int c = 0; c < kQBlock; ++c) s += int32_t(static_cast<int8_t>(blk[2 + c])) * int32_t(x[c]);
      acc += fp16_to_f32(load_u16(blk)) * xd[0][b] * float(s);
    }
    out[r][0] = acc;
  }
}

const BlockKernels kKernels = {
    "q8_0",
    kBlockBytes,
    {{tile_avx2<1, false>, tile_avx2<1, true>}, {tile_avx2<2, false>, tile_avx2<2, true>}},
    tile_scalar,
};

}  // namespace

void gemm_q8_0(const float* x, int64_t m, const WeightView& w, float* y) { gemm_blocks(x, m, w, y, kKernels); }

}  // namespace tessera::cpu
