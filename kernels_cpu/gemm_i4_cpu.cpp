// Group-wise int4 GEMM: weights stay packed (two per byte) and are unpacked in registers; never
// expanded to a float copy of the matrix.
//
// AVX2 path (groups that are a multiple of 32): each activation row is quantized once per call to
// int8 in blocks of 32 (scale amax/127, as llama.cpp's Q8_0 activations). The zero point is folded
// out of the inner loop:  Σ x·(q − z)·s  =  s·(Σ x·q − z·Σ x)  per group, with Σ x taken from the
// quantized activations so that the result is exactly the dot of the two dequantized vectors.
// Weights are packed in bands of 8 rows (prepare_weight_i4) whose 32-byte chunks hold four
// columns of each row in the low nibbles and the next four in the high ones, so that a broadcast
// quad of x multiplies all 8 rows at once (maddubs: unsigned nibble × signed int8) and each row's
// block dot lands in its own int32 lane: per block of 32 columns and 8 rows, one conversion and
// one FMA, no horizontal sums. Against the previous layout (4-row tiles of row-major blocks, x
// de-interleaved), prefill ran 40-70% faster (BM_Gemm/3/128, 3 alternating rounds) and a thread's
// decode GEMV from L2/L3 20-40% (BM_Gemm/3/1, one thread); the int4 110m decode, which waits on
// memory, ran as before (median ratio 0.98 over 30 alternating `tessera run` pairs).
//
// Where the CPU has AVX-512 VNNI, vpdpbusd does each block's multiplies and sums (band_row_vnni):
// from cache a thread's decode GEMV ran 15-25% faster than the AVX2 code (BM_Gemm/3/1, one thread,
// 30 alternating runs each), the int4 110m decode ~10% faster (8 alternating `tessera run` pairs).
//
// The quantizer's weights (scales, zeros and nibbles in one buffer) are then laid out as one
// stream, each group's scales and zeros just before its nibbles (I4Layout), so that a decode thread
// reads one sequential stream where it read three (nibbles, scales, zeros): the int4 110m decode
// ran 6% faster (median of 12 alternating `tessera run` pairs, 9 faster), though its f32 output
// head is 60% of its bytes. The bands' scales and zeros all ahead of their nibbles, a band at a
// time, ran 18% slower (16 pairs): the prefetcher follows one stream, not three within a band.
// Two bands a step, x's permutes shared (bands_row_vnni<2>, the pair's groups interleaved in the
// stream): 12% less time from cache, a 27.5M model with its int4 weights in L3 decoded 23% faster,
// but 100 MB of 2048x768 GEMVs streamed from memory 10-17% slower (both layouts timed in turn in
// one process, 10 rounds, 2 threads, in slow and fast minutes): not kept, decode waits on memory.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <string>
#include <vector>

#include "kernels_cpu.h"
#include "stealing_bands_cpu.h"
#include "tessera/error.h"

namespace tessera::cpu {

namespace {

// WeightView::kernel_variant for I4 on the CPU (kernels_cpu.h): auto (vnni where the CPU has it,
// else avx2; the scalar code without AVX2 or where groups are not whole blocks of 32), reference
// (scalar), avx2 or vnni; plus the flag bits prepare_weight_i4 sets.
constexpr int32_t kPackedBands = 1 << 8;
constexpr int32_t kBandStream = 1 << 9;  // with kPackedBands: a group's scales and zeros before its nibbles

constexpr int64_t kBlock = 32;                                  // activation quantization block (elements)
constexpr int64_t kRowsPerBand = 8;                             // rows packed together, one int32 lane each
constexpr int64_t kBandBlockBytes = kRowsPerBand * kBlock / 2;  // a band's nibbles of one block
constexpr int64_t kPrefetchBytes = 2048;  // the AVX2 decode's prefetch distance off Intel (decode_prefetch_bytes)

// Decode's software prefetch of a block's two cache lines `ahead` bytes on (decode_prefetch_bytes).
inline void prefetch_block(const uint8_t* chunk, int64_t ahead) {
  if (ahead != 0) {
    _mm_prefetch(reinterpret_cast<const char*>(chunk) + ahead, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(chunk) + ahead + 64, _MM_HINT_T0);
  }
}

// Reference: float arithmetic, any group size; used without AVX2.
void gemm_i4_scalar(const float* x, int64_t m, const WeightView& w, float* y, int64_t j0, int64_t j1) {
  const int64_t k = w.cols;
  const int64_t g = w.group_size;
  const int64_t groups = k / g;
  const auto* packed = static_cast<const uint8_t*>(w.data);
  for (int64_t i = 0; i < m; ++i) {
    const float* xr = x + i * k;
    for (int64_t j = j0; j < j1; ++j) {
      const uint8_t* wr = packed + j * (k / 2);
      float acc = 0;
      for (int64_t gi = 0; gi < groups; ++gi) {
        const float scale = w.scales[j * groups + gi];
        const float zero = w.zeros != nullptr ? w.zeros[j * groups + gi] : 8.0f;
        float part = 0;
        for (int64_t c = gi * g; c < (gi + 1) * g; ++c) {
          const int q = (c & 1) ? (wr[c / 2] >> 4) : (wr[c / 2] & 0x0f);
          part += xr[c] * (float(q) - zero);
        }
        acc += part * scale;
      }
      y[i * w.rows + j] = acc;
    }
  }
}

// x quantized for the AVX2 kernel, in column order.
struct QuantizedX {
  std::vector<int8_t> q;     // [m][k]
  std::vector<float> d;      // [m][k/32] block scales
  std::vector<float> gsum;   // [m][k/g] Σ x over each weight group (of the quantized values)
};

// max |x| over a block of 32.
__attribute__((target("avx2,fma"))) float block_amax_avx2(const float* xb) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 v = _mm256_max_ps(_mm256_and_ps(abs_mask, _mm256_loadu_ps(xb)), _mm256_and_ps(abs_mask, _mm256_loadu_ps(xb + 8)));
  v = _mm256_max_ps(v, _mm256_and_ps(abs_mask, _mm256_loadu_ps(xb + 16)));
  v = _mm256_max_ps(v, _mm256_and_ps(abs_mask, _mm256_loadu_ps(xb + 24)));
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

// A block of 32 to int8 (x·id rounded to nearest even: cvtps under the default MXCSR, as
// nearbyint); returns Σq.
__attribute__((target("avx2,fma"))) int quantize_block_avx2(const float* xb, float id, int8_t* qb) {
  const __m256 vid = _mm256_set1_ps(id);
  const __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb), vid));
  const __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + 8), vid));
  const __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + 16), vid));
  const __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + 24), vid));
  const __m256i s = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
  __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(1, 0, 3, 2)));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(2, 3, 0, 1)));
  // packs interleaves 128-bit lanes; the dword permute restores element order.
  const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(qb), _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  return _mm_cvtsi128_si32(s4);
}

// Only the AVX2 kernel reads quantized x. Σ x per group is accumulated here, outside the AVX2
// functions, so that d·Σq is rounded before it is added (never fused).
void quantize_x(const float* x, int64_t m, int64_t k, int64_t g, QuantizedX& out) {
  const int64_t blocks = k / kBlock;
  const int64_t groups = k / g;
  const int64_t blocks_per_group = g / kBlock;
  out.q.resize(size_t(m * k));
  out.d.resize(size_t(m * blocks));
  out.gsum.assign(size_t(m * groups), 0.0f);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t b = 0; b < blocks; ++b) {
      const float* xb = x + i * k + b * kBlock;
      const float d = block_amax_avx2(xb) / 127.0f;
      const float id = d != 0 ? 1.0f / d : 0.0f;
      const int sum = quantize_block_avx2(xb, id, out.q.data() + i * k + b * kBlock);
      out.d[size_t(i * blocks + b)] = d;
      out.gsum[size_t(i * groups + b / blocks_per_group)] += d * float(sum);
    }
  }
}

// A band of 8 rows as prepare_weight_i4 packs it: per block of 32 columns, four 32-byte chunks;
// chunk c holds, for row r at bytes 4r..4r+3, columns 8c..8c+3 in the low nibbles and 8c+4..8c+7
// in the high ones. Scales per group, the band's 8 side by side, as are the zero points' terms:
// s·z, rounded once at preparation (the kernels multiplied s by z on every call: the same
// products, a load and a multiply less a group).
struct Band {
  const uint8_t* w;   // group 0's blocks of nibbles, one after another
  const float* s;     // group 0's 8 scales
  const float* sz;    // group 0's 8 s·z; null: symmetric, zero point 8
  int64_t w_group_bytes;   // from one group's nibbles to the next's
  int64_t p_group_floats;  // from one group's scales (s·z) to the next's

  const uint8_t* block(int64_t b, int64_t blocks_per_group) const {
    return w + b / blocks_per_group * w_group_bytes + b % blocks_per_group * kBandBlockBytes;
  }
  const float* scales(int64_t gi) const { return s + gi * p_group_floats; }
  const float* zero_terms(int64_t gi) const { return sz + gi * p_group_floats; }
};

// A band whose groups' nibbles follow one another, as do their scales (s·z).
Band separate_band(const uint8_t* w, const float* s, const float* sz, int64_t blocks_per_group) {
  return {w, s, sz, blocks_per_group * kBandBlockBytes, kRowsPerBand};
}

// Where a view's bands and its other rows are (prepare_weight_i4). Unpacked: every row
// row-major, scales and zeros [row][group]. Packed bands: rows [0, bands_end) in bands in place,
// their scales (s·z) [band][group][row]; later rows as unpacked. Band stream: band after band,
// group after group, each group's 8 scales, 8 s·z, then its blocks of nibbles; then the later
// rows' scales, zeros and nibbles, the view's scales and zeros pointing at theirs.
struct I4Layout {
  const WeightView& w;
  int64_t groups, row_bytes, bands_end, band_params, band_bytes;
  const uint8_t* data;
  const uint8_t* tail_nibbles;  // row bands_end's nibbles (or row 0's, unpacked)
  int64_t tail_first;           // the row view.scales[0] belongs to

  explicit I4Layout(const WeightView& view)
      : w(view),
        groups(view.cols / view.group_size),
        row_bytes(view.cols / 2),
        bands_end((view.kernel_variant & kPackedBands) != 0 ? view.rows / kRowsPerBand * kRowsPerBand : 0),
        band_params(kRowsPerBand * groups * int64_t(sizeof(float)) * (view.zeros != nullptr ? 2 : 1)),
        band_bytes(band_params + kRowsPerBand * row_bytes),
        data(static_cast<const uint8_t*>(view.data)) {
    tail_first = stream() ? bands_end : 0;
    tail_nibbles = stream() ? data + bands_end / kRowsPerBand * band_bytes +
                                (view.rows - bands_end) * (band_params / kRowsPerBand)
                          : data;
  }
  bool stream() const { return (w.kernel_variant & kBandStream) != 0; }
  // The whole band starting at row j (< bands_end).
  Band band(int64_t j) const {
    const int64_t blocks_per_group = w.group_size / kBlock;
    if (!stream()) {
      return separate_band(data + j * row_bytes, w.scales + j * groups,
                           w.zeros != nullptr ? w.zeros + j * groups : nullptr, blocks_per_group);
    }
    const int64_t group_bytes = band_bytes / groups;
    const int64_t param_bytes = band_params / groups;
    const uint8_t* at = data + j / kRowsPerBand * band_bytes;
    const auto* s = reinterpret_cast<const float*>(at);
    return {at + param_bytes, s, w.zeros != nullptr ? s + kRowsPerBand : nullptr, group_bytes, group_bytes / 4};
  }
  // Row r (>= bands_end): its nibbles, scales and zeros.
  const uint8_t* nibbles(int64_t r) const { return tail_nibbles + (r - tail_first) * row_bytes; }
  float scale(int64_t r, int64_t gi) const { return w.scales[(r - tail_first) * groups + gi]; }
  float zero(int64_t r, int64_t gi) const { return w.zeros[(r - tail_first) * groups + gi]; }
};

// Where column c (of a block, < 32) of band row r sits: byte and nibble (0 low, 1 high).
inline int64_t band_byte(int64_t r, int64_t c) { return c / 8 * 32 + r * 4 + c % 4; }
inline int band_nibble(int64_t c) { return int(c % 8 / 4); }

// Row r (< 8) of a band, from its row-major nibbles (column 2i low, 2i + 1 high, in byte i).
void pack_band_row(const uint8_t* row, int64_t k, int64_t r, uint8_t* band) {
  for (int64_t b = 0; b < k / kBlock; ++b) {
    uint8_t* dst = band + b * kBandBlockBytes;
    for (int64_t c = 0; c < kBlock; c += 8) std::fill_n(dst + band_byte(r, c), 4, uint8_t(0));
    for (int64_t c = 0; c < kBlock; ++c) {
      const int64_t col = b * kBlock + c;
      const uint8_t q = (col & 1) ? row[col / 2] >> 4 : row[col / 2] & 0x0f;
      dst[band_byte(r, c)] |= uint8_t(q << (4 * band_nibble(c)));
    }
  }
}

// What group gi's zero points add to x·q·s for the band's 8 rows, s·z·Σx, side by side. Every
// kernel adds these up in group order, one sum a row beside its dot products' (so that decode,
// prefill and both instruction sets give the same bits), and subtracts it at the end. Done in the
// group loop as the band streams by, where its s·z was just read, rather than in a second pass
// over the band's parameters that multiplied s by z (in four chains, one chain of 24 dependent
// adds being slow there): a thread's asymmetric GEMV from L2 took ~2% less time (BM_Gemm/10/1, 5
// alternating runs: 768x768 9.08-9.40 -> 8.89-9.17 us), the decode from memory the same.
__attribute__((target("avx2,fma"))) inline __m256 add_zero_point_term(__m256 sum, const Band& band, int64_t gi,
                                                                      float gs) {
  const __m256 sz = band.sz != nullptr ? _mm256_loadu_ps(band.zero_terms(gi))
                                       : _mm256_mul_ps(_mm256_loadu_ps(band.scales(gi)), _mm256_set1_ps(8.0f));
  __m256 p = _mm256_mul_ps(sz, _mm256_set1_ps(gs));
  asm("" : "+x"(p));  // rounded, never fused into the add
  return _mm256_add_ps(sum, p);
}

// A 32-byte chunk split into its low nibbles and its high ones.
struct Nibbles {
  __m256i lo, hi;
};

__attribute__((target("avx2,fma"))) inline Nibbles split(__m256i b) {
  const __m256i mask = _mm256_set1_epi8(0x0f);
  return {_mm256_and_si256(b, mask), _mm256_and_si256(_mm256_srli_epi16(b, 4), mask)};
}

// One row of quantized x against a band: y[r] for r < rows. Per block, the 8 rows' int32 dots
// with the block of x (each of the eight products' pair sums is at most 2·15·127, so their int16
// total stays below 32767), converted once and added with the rows' s·dx. Nibbles come from the
// band (decode, with a prefetch ahead of the stream) or, kUnpacked, from `nib`: the band's nibbles
// split once for every row of x (8 vectors a block). Either way each row of x sees the same
// arithmetic in the same order, so its result does not depend on m (decode, prefill and
// verification agree to the bit). Decode reads one band at a time: four bands side by side, as
// the int8 panels stream, were no faster (10 + 6 alternating int4 110m runs), each band bringing
// a stream of scales along with its weights.
template <bool kUnpacked>
__attribute__((target("avx2,fma"))) void band_row(const int8_t* xr, const float* xd, const float* gsum,
                                                  const Band& band, const uint8_t* nib, int64_t k, int64_t g,
                                                  int64_t rows, float* y, int64_t ahead = 0) {
  const int64_t blocks = k / kBlock;
  const int64_t blocks_per_group = g / kBlock;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc = _mm256_setzero_ps(), zero_terms = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    if (b % blocks_per_group == 0) {
      zero_terms = add_zero_point_term(zero_terms, band, b / blocks_per_group, gsum[b / blocks_per_group]);
    }
    const auto* xq = reinterpret_cast<const int32_t*>(xr + b * kBlock);
    const uint8_t* chunk = band.block(b, blocks_per_group);
    if constexpr (!kUnpacked) prefetch_block(chunk, ahead);
    __m256i sum = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      Nibbles n;
      if constexpr (kUnpacked) {
        const auto* v = reinterpret_cast<const __m256i*>(nib) + b * 8 + 2 * c;
        n = {_mm256_loadu_si256(v), _mm256_loadu_si256(v + 1)};
      } else {
        n = split(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + c * 32)));
      }
      sum = _mm256_add_epi16(sum, _mm256_maddubs_epi16(n.lo, _mm256_set1_epi32(xq[2 * c])));
      sum = _mm256_add_epi16(sum, _mm256_maddubs_epi16(n.hi, _mm256_set1_epi32(xq[2 * c + 1])));
    }
    const __m256 sd = _mm256_mul_ps(_mm256_loadu_ps(band.scales(b / blocks_per_group)), _mm256_set1_ps(xd[b]));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(sum, ones)), sd, acc);
  }
  alignas(32) float out[kRowsPerBand];
  _mm256_store_ps(out, _mm256_sub_ps(acc, zero_terms));
  std::copy_n(out, rows, y);
}

// band_row with AVX-512 VNNI: vpdpbusd multiplies the unsigned nibbles by the signed x bytes and
// adds each quad of products straight into the row's int32 lane. The high nibbles stay in place
// (and with 0xf0: 16·q) in their own accumulator, divided by 16 once a block (exact), so a chunk
// costs two ands and two vpdpbusd where the AVX2 code needs three operations to split it and four
// to multiply and sum. Same int32 dots, so the same results to the bit. Two chunks a 512-bit
// vector (x's quads permuted to match once a block): in the fast minutes of a Zen 4 VM the int4
// 110m decode's median share of the bandwidth probe 0.805 -> 0.818 (BM_DecodeRoofline/2, 10
// alternating pairs, 9 higher). Groups, then their blocks: no division per block. Two accumulator
// chains a half (four in all) were no faster. S bands side by side, each its own stream: amd
// tuning one a thread with no software prefetch; intel tuning four through the range's quarters,
// 8 KiB prefetched ahead over them (int4 110m decode 180 -> 210 tok/s, 6 alternating `tessera run
// -n 256` pairs, all faster; the prefetch alone gave +5%).
template <int S>
__attribute__((target(VNNI_TARGET))) void bands_row_vnni(const int8_t* xr, const float* xd, const float* gsum,
                                                         const Band* bands, int64_t k, int64_t g, int64_t rows,
                                                         float* const* y, int64_t ahead) {
  const int64_t groups = k / g;
  const int64_t blocks_per_group = g / kBlock;
  const __m512i mask = _mm512_set1_epi8(0x0f);
  // A 64-byte load holds chunks c and c + 1: lanes 0-7 chunk c's rows, 8-15 chunk c + 1's. Its low
  // nibbles meet x quads 2c and 2c + 2, its high ones 2c + 1 and 2c + 3 (picked from the block's
  // eight quads once a block, for every band).
  const __m512i pick_lo01 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2);
  const __m512i pick_hi01 = _mm512_setr_epi32(1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m512i pick_lo23 = _mm512_setr_epi32(4, 4, 4, 4, 4, 4, 4, 4, 6, 6, 6, 6, 6, 6, 6, 6);
  const __m512i pick_hi23 = _mm512_setr_epi32(5, 5, 5, 5, 5, 5, 5, 5, 7, 7, 7, 7, 7, 7, 7, 7);
  __m256 acc[S], zero_terms[S];
  for (int p = 0; p < S; ++p) acc[p] = zero_terms[p] = _mm256_setzero_ps();
  for (int64_t gi = 0, b = 0; gi < groups; ++gi) {
#pragma GCC unroll 4
    for (int p = 0; p < S; ++p) zero_terms[p] = add_zero_point_term(zero_terms[p], bands[p], gi, gsum[gi]);
    for (int64_t gb = 0; gb < blocks_per_group; ++gb, ++b) {
      const __m512i xb = _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xr + b * kBlock)));
      const __m512i x_lo01 = _mm512_permutexvar_epi32(pick_lo01, xb), x_hi01 = _mm512_permutexvar_epi32(pick_hi01, xb);
      const __m512i x_lo23 = _mm512_permutexvar_epi32(pick_lo23, xb), x_hi23 = _mm512_permutexvar_epi32(pick_hi23, xb);
      const __m256 dx = _mm256_set1_ps(xd[b]);
#pragma GCC unroll 4
      for (int p = 0; p < S; ++p) {
        const uint8_t* chunk = bands[p].w + gi * bands[p].w_group_bytes + gb * kBandBlockBytes;
        prefetch_block(chunk, ahead);
        const __m512i w01 = _mm512_loadu_si512(chunk), w23 = _mm512_loadu_si512(chunk + 64);
        __m512i lo = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_and_si512(w01, mask), x_lo01);
        __m512i hi = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_andnot_si512(mask, w01), x_hi01);
        lo = _mm512_dpbusd_epi32(lo, _mm512_and_si512(w23, mask), x_lo23);
        hi = _mm512_dpbusd_epi32(hi, _mm512_andnot_si512(mask, w23), x_hi23);
        const __m512i both = _mm512_add_epi32(lo, _mm512_srai_epi32(hi, 4));  // per lane 16·q·x / 16, exact
        const __m256i dot = _mm256_add_epi32(_mm512_castsi512_si256(both), _mm512_extracti64x4_epi64(both, 1));
        const __m256 sd = _mm256_mul_ps(_mm256_loadu_ps(bands[p].scales(gi)), dx);
        acc[p] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), sd, acc[p]);
      }
    }
  }
  for (int p = 0; p < S; ++p) {
    alignas(32) float out[kRowsPerBand];
    _mm256_store_ps(out, _mm256_sub_ps(acc[p], zero_terms[p]));
    std::copy_n(out, rows, y[p]);
  }
}

// Prefill with VNNI on two neighbouring bands at once, their chunks interleaved into `nib`
// (run_band_pair) and their scales, then their s·z, into `s16` ([group][16] each): a 64-byte line
// holds one x quad's columns for all 16 rows, so each vpdpbusd takes the quad broadcast and its 16
// lanes are 16 rows' dots, with no permutes of x and no folding of halves, and a block's float
// work (combine, convert, scale, FMA) serves 16 rows a vector where one band's served 8: the
// 128-row prefill from cache, one thread, took ~30% less time than one band at a time
// (BM_Gemm/3/128/2048/768, 768/2048 and 768/768, 3 alternating runs: 2430-2653 -> 1672-1722 us,
// 2562-2712 -> 1737-1784, 924-931 -> 639-651).
// Decode keeps 8-row bands: laid out in 16-row bands, its share of the bandwidth probe was lower
// (int4 110m, BM_DecodeRoofline/2, ~0.81 vs ~0.845 median in the fast minutes over ~10 alternating
// pairs of several variants). kRows rows of x (row r at xr + r·k, its y at y + r·ldy; `rows` of the
// 16 stored): each load of the split nibbles serves every row of x, and each row takes the same
// operations in the same order whatever kRows, so its bits are the same alone or in a batch, and
// the same as bands_row_vnni's (the same exact dots and float operations). Four rows of x: against
// one at a time ~20% less time (measured on one band); eight spill registers (twice the time).
template <int kRows>
__attribute__((target(VNNI_TARGET))) void band_pair_rows_vnni(const int8_t* xr, const float* xd, const float* gsum,
                                                              const Band (&pair)[2], const uint8_t* nib,
                                                              const float* s16, int64_t k, int64_t g, int64_t rows,
                                                              float* y, int64_t ldy) {
  const int64_t groups = k / g;
  const int64_t blocks = k / kBlock;
  const int64_t blocks_per_group = g / kBlock;
  const float* sz16 = s16 + groups * 2 * kRowsPerBand;
  __m512 acc[kRows], zero_terms[kRows];
  for (int r = 0; r < kRows; ++r) acc[r] = zero_terms[r] = _mm512_setzero_ps();
  for (int64_t gi = 0, b = 0; gi < groups; ++gi) {
    const __m512 s = _mm512_loadu_ps(s16 + gi * 2 * kRowsPerBand);
    const __m512 sz = _mm512_loadu_ps(sz16 + gi * 2 * kRowsPerBand);
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {  // as add_zero_point_term, 16 rows a vector
      __m512 p = _mm512_mul_ps(sz, _mm512_set1_ps(gsum[r * groups + gi]));
      asm("" : "+v"(p));
      zero_terms[r] = _mm512_add_ps(zero_terms[r], p);
    }
    for (int64_t gb = 0; gb < blocks_per_group; ++gb, ++b) {
      __m512i lo[kRows], hi[kRows];
      for (int r = 0; r < kRows; ++r) lo[r] = hi[r] = _mm512_setzero_si512();
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        const auto* v = reinterpret_cast<const __m512i*>(nib) + b * 8 + 2 * c;
        const __m512i l = _mm512_loadu_si512(v), h = _mm512_loadu_si512(v + 1);
#pragma GCC unroll 4
        for (int r = 0; r < kRows; ++r) {
          const auto* xq = reinterpret_cast<const int32_t*>(xr + r * k + b * kBlock);
          lo[r] = _mm512_dpbusd_epi32(lo[r], l, _mm512_set1_epi32(xq[2 * c]));
          hi[r] = _mm512_dpbusd_epi32(hi[r], h, _mm512_set1_epi32(xq[2 * c + 1]));
        }
      }
#pragma GCC unroll 4
      for (int r = 0; r < kRows; ++r) {
        const __m512 sd = _mm512_mul_ps(s, _mm512_set1_ps(xd[r * blocks + b]));
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(lo[r], hi[r])), sd, acc[r]);
      }
    }
  }
  for (int r = 0; r < kRows; ++r) {
    _mm512_mask_storeu_ps(y + r * ldy, __mmask16((1u << rows) - 1), _mm512_sub_ps(acc[r], zero_terms[r]));
  }
}

// Two neighbouring bands against m > 1 quantized rows of x, `rows` of their 16 rows stored (y at
// the first band's first column; a band alone comes as a pair with itself, its rows stored): their
// nibbles split and interleaved once into `scratch` (per block of 32 columns, four pairs of 64-byte
// lines: both bands' chunk c, low nibbles, then high ones), then their scales, then their s·z.
__attribute__((target(VNNI_TARGET))) void run_band_pair(const QuantizedX& xq, int64_t m, const Band (&pair)[2],
                                                        int64_t rows, int64_t k, int64_t g, float* y, int64_t n,
                                                        std::vector<uint8_t>& scratch) {
  const int64_t blocks = k / kBlock;
  const int64_t groups = k / g;
  const int64_t nibble_bytes = blocks * 8 * int64_t(sizeof(__m512i));
  scratch.resize(size_t(nibble_bytes + 2 * groups * 2 * kRowsPerBand * int64_t(sizeof(float))));
  auto* v = reinterpret_cast<__m512i*>(scratch.data());
  const __m512i mask = _mm512_set1_epi8(0x0f);
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* first = pair[0].block(b, g / kBlock);
    const uint8_t* second = pair[1].block(b, g / kBlock);
    for (int c = 0; c < 4; ++c) {
      const __m512i w = _mm512_inserti64x4(
          _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(first + 32 * c))),
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(second + 32 * c)), 1);
      _mm512_storeu_si512(v + b * 8 + 2 * c, _mm512_and_si512(w, mask));
      _mm512_storeu_si512(v + b * 8 + 2 * c + 1, _mm512_and_si512(_mm512_srli_epi16(w, 4), mask));
    }
  }
  auto* s16 = reinterpret_cast<float*>(scratch.data() + nibble_bytes);
  float* sz16 = s16 + groups * 2 * kRowsPerBand;
  for (int64_t gi = 0; gi < groups; ++gi) {
    for (int half = 0; half < 2; ++half) {
      const Band& band = pair[half];
      const int64_t at = gi * 2 * kRowsPerBand + half * kRowsPerBand;
      std::copy_n(band.scales(gi), kRowsPerBand, s16 + at);
      for (int64_t r = 0; r < kRowsPerBand; ++r) {
        sz16[at + r] = band.sz != nullptr ? band.zero_terms(gi)[r] : band.scales(gi)[r] * 8.0f;
      }
    }
  }
  int64_t i = 0;
  for (; i + 4 <= m; i += 4) {
    band_pair_rows_vnni<4>(xq.q.data() + i * k, xq.d.data() + i * blocks, xq.gsum.data() + i * groups, pair,
                           scratch.data(), s16, k, g, rows, y + i * n, n);
  }
  for (; i < m; ++i) {
    band_pair_rows_vnni<1>(xq.q.data() + i * k, xq.d.data() + i * blocks, xq.gsum.data() + i * groups, pair,
                           scratch.data(), s16, k, g, rows, y + i * n, n);
  }
}

// One band against all m quantized rows of x (y at the band's first column). For m > 1 VNNI takes
// it as a pair with itself (run_band_pair); the AVX2 code splits its nibbles once into `scratch`
// (256 bytes per block of 32 columns, L1-resident) for every row.
__attribute__((target("avx2,fma"))) void run_band(const QuantizedX& xq, int64_t m, const Band& band, int64_t rows,
                                                  int64_t k, int64_t g, float* y, int64_t n,
                                                  std::vector<uint8_t>& scratch, bool vnni) {
  const int64_t blocks = k / kBlock;
  const int64_t groups = k / g;
  if (m == 1) {
    if (vnni) {
      return bands_row_vnni<1>(xq.q.data(), xq.d.data(), xq.gsum.data(), &band, k, g, rows, &y, decode_prefetch_bytes(0));
    }
    return band_row<false>(xq.q.data(), xq.d.data(), xq.gsum.data(), band, nullptr, k, g, rows, y,
                           decode_prefetch_bytes(kPrefetchBytes));
  }
  if (vnni) {
    const Band pair[2] = {band, band};
    return run_band_pair(xq, m, pair, rows, k, g, y, n, scratch);
  }
  scratch.resize(size_t(blocks * 8 * sizeof(__m256i)));
  auto* v = reinterpret_cast<__m256i*>(scratch.data());
  for (int64_t gi = 0, i = 0; gi < groups; ++gi) {  // a group's 32-byte chunks are one after another
    const uint8_t* group = band.w + gi * band.w_group_bytes;
    for (int64_t c = 0; c < g / kBlock * 4; ++c, ++i) {
      const Nibbles nb = split(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(group + c * 32)));
      _mm256_storeu_si256(v + 2 * i, nb.lo);
      _mm256_storeu_si256(v + 2 * i + 1, nb.hi);
    }
  }
  for (int64_t i = 0; i < m; ++i) {
    band_row<true>(xq.q.data() + i * k, xq.d.data() + i * blocks, xq.gsum.data() + i * groups, band,
                   scratch.data(), k, g, rows, y + i * n);
  }
}

// Rows [j0, j1) of W (j0 a multiple of kRowsPerBand) against all m quantized rows of x. Whole bands
// of packed weights are read in place; rows that are not (a view that was not prepared, the rows
// after the last whole band) are packed into a band here first, the last row repeated, so that a
// row's result is the same packed or not.
void gemm_i4_avx2(const QuantizedX& xq, int64_t m, const WeightView& w, float* y, int64_t j0, int64_t j1,
                  std::vector<uint8_t>& scratch, bool vnni) {
  const int64_t k = w.cols;
  const int64_t n = w.rows;
  const I4Layout at(w);
  thread_local std::vector<uint8_t> own_w;
  thread_local std::vector<float> own_s, own_sz;
  int64_t j = j0;
  constexpr int S = kIntelI4DecodeStreams;
  if (const int64_t whole = (std::min(j1, at.bands_end) - j0) / kRowsPerBand;
      m == 1 && vnni && stream_tuning() == StreamTuning::intel && whole >= S) {  // S streams through the range's parts
    const int64_t spacing = whole / S;
    for (; j < j0 + spacing * kRowsPerBand; j += kRowsPerBand) {
      Band bands[S];
      float* ys[S];
      for (int p = 0; p < S; ++p) {
        bands[p] = at.band(j + p * spacing * kRowsPerBand);
        ys[p] = y + j + p * spacing * kRowsPerBand;
      }
      bands_row_vnni<S>(xq.q.data(), xq.d.data(), xq.gsum.data(), bands, k, w.group_size, kRowsPerBand, ys,
                        decode_prefetch_bytes(0) / S);
    }
    j = j0 + spacing * S * kRowsPerBand;
  }
  for (; j < j1; j += kRowsPerBand) {
    const int64_t rows = std::min(kRowsPerBand, j1 - j);
    if (m > 1 && vnni && j + 2 * kRowsPerBand <= std::min(j1, at.bands_end)) {
      const Band pair[2] = {at.band(j), at.band(j + kRowsPerBand)};
      run_band_pair(xq, m, pair, 2 * kRowsPerBand, k, w.group_size, y + j, n, scratch);
      j += kRowsPerBand;
      continue;
    }
    if (j < at.bands_end) {
      run_band(xq, m, at.band(j), rows, k, w.group_size, y + j, n, scratch, vnni);
      continue;
    }
    own_w.resize(size_t(kRowsPerBand * at.row_bytes));
    own_s.resize(size_t(kRowsPerBand * at.groups));
    own_sz.resize(w.zeros != nullptr ? own_s.size() : 0);
    for (int64_t r = 0; r < kRowsPerBand; ++r) {
      const int64_t src = j + std::min(r, rows - 1);
      pack_band_row(at.nibbles(src), k, r, own_w.data());
      for (int64_t gi = 0; gi < at.groups; ++gi) {
        own_s[size_t(gi * kRowsPerBand + r)] = at.scale(src, gi);
        if (w.zeros != nullptr) own_sz[size_t(gi * kRowsPerBand + r)] = at.scale(src, gi) * at.zero(src, gi);
      }
    }
    const Band band = separate_band(own_w.data(), own_s.data(), w.zeros != nullptr ? own_sz.data() : nullptr,
                                    w.group_size / kBlock);
    run_band(xq, m, band, rows, k, w.group_size, y + j, n, scratch, vnni);
  }
}

// Splits output rows [0, n) into bands across an OpenMP team when the work is large enough, or
// (decode) when the weights streamed are: one core reaches about half of the memory bandwidth.
template <class F>
void for_row_ranges(int64_t m, const WeightView& w, F run) {
  const int64_t n = w.rows, k = w.cols;
  const int64_t bands = (n + kRowsPerBand - 1) / kRowsPerBand;
  const int64_t groups = k / w.group_size;
  const int64_t bytes = n * (k / 2) + n * groups * int64_t(sizeof(float)) * (w.zeros != nullptr ? 2 : 1);
  if ((m * n * k < kParallelWork && bytes < kParallelStreamBytes) || team_max_threads() == 1 || bands == 1) {
    run(int64_t(0), n);
    return;
  }
  // Decode: each thread requests its band's first lines (weights, scales, zeros) before it claims
  // (int4 110m decode +4-5%: BM_DecodeRoofline/2, 16 runs alternated in one process; 2 KiB no better).
  const I4Layout at(w);
  auto start = [&](int64_t band) {
    const int64_t j = band * kRowsPerBand;
    if (m != 1 || j >= at.bands_end) return;
    const Band b = at.band(j);
    prefetch_lines(b.w, kStreamStartBytes);
    prefetch_lines(b.s, 64);
    if (b.sz != nullptr) prefetch_lines(b.sz, 64);
  };
  // Decode claims the thread's whole band at once (claim divisor 1): its stream runs from the band's
  // first line to its last in one pass, and the other thread steals from it only if it has not
  // started. Claimed an eighth of what was left at a time, a thread made ~20 claims a GEMV and,
  // done first, stole the other's last bands one at a time, each a short stream from a cold start:
  // the int4 GEMVs of an int4 110m decode read at 0.63-0.66 of the f32 head's rate in the same run
  // where whole bands read at 0.69-0.73 (median of 6-14 alternating `tessera run -n 256` each, in
  // the fast minutes, head at 57-82 GB/s; the minutes at ~35 GB/s read 0.93-0.95 either way).
  for_units(bands, [&](int64_t b0, int64_t b1) { run(b0 * kRowsPerBand, std::min(n, b1 * kRowsPerBand)); },
            m == 1 ? 1 : StealingBands::kClaimDivisor, start);
}

bool avx2_applies(const WeightView& w) {
  const int64_t k = w.cols;
  const int64_t g = w.group_size;
  return has_avx2() && g > 0 && g % kBlock == 0 && k % g == 0;
}

}  // namespace

void prepare_weight_i4(WeightView& w) {
  // Only the AVX2 and VNNI kernels read packed bands (the scalar code reads rows); a view
  // is packed once. Whole bands of 8 rows take the layout of Band (gemm_i4_avx2), and each group's
  // 8 scales (and s·z in place of the zeros) side by side. Rows after the last whole band stay
  // row-major. Where the view's scales, zeros and nibbles lie one after another in one buffer (as
  // the int4 quantizer stores them), the bands are then laid out as one stream (I4Layout): a
  // decode thread reads one sequential stream instead of three.
  WeightView v = w;
  if (v.group_size <= 0) v.group_size = v.cols;  // one group per row, as gemm_i4 reads it
  if (!simd_kernel(w.kernel_variant) || !avx2_applies(v)) return;
  const int64_t k = w.cols;
  const int64_t row_bytes = k / 2;
  const int64_t groups = k / v.group_size;
  auto* data = static_cast<uint8_t*>(const_cast<void*>(w.data));
  std::vector<uint8_t> rows(size_t(kRowsPerBand * row_bytes));
  std::vector<float> params(size_t(kRowsPerBand * groups));
  // Per-group floats of a band from [row][group] to [group][row].
  auto transpose = [&](float* band) {
    std::copy(band, band + kRowsPerBand * groups, params.begin());
    for (int64_t r = 0; r < kRowsPerBand; ++r) {
      for (int64_t gi = 0; gi < groups; ++gi) band[gi * kRowsPerBand + r] = params[size_t(r * groups + gi)];
    }
  };
  for (int64_t j = 0; j + kRowsPerBand <= w.rows; j += kRowsPerBand) {
    uint8_t* band = data + j * row_bytes;
    std::copy(band, band + kRowsPerBand * row_bytes, rows.begin());
    for (int64_t r = 0; r < kRowsPerBand; ++r) pack_band_row(rows.data() + r * row_bytes, k, r, band);
    auto* scales = const_cast<float*>(w.scales) + j * groups;
    transpose(scales);
    if (w.zeros != nullptr) {  // the kernels read s·z (Band)
      auto* zeros = const_cast<float*>(w.zeros) + j * groups;
      transpose(zeros);
      for (int64_t i = 0; i < kRowsPerBand * groups; ++i) zeros[i] *= scales[i];
    }
  }
  w.kernel_variant |= kPackedBands;

  const bool asym = w.zeros != nullptr;
  const int64_t param_floats = w.rows * groups;  // of the scales (of the zeros)
  auto* base = reinterpret_cast<uint8_t*>(const_cast<float*>(w.scales));
  const bool one_buffer =
      (!asym || w.zeros == w.scales + param_floats) && data == base + param_floats * 4 * (asym ? 2 : 1);
  if (!one_buffer) return;
  const int64_t bands_end = w.rows / kRowsPerBand * kRowsPerBand, tail = w.rows - bands_end;
  std::vector<uint8_t> stream;
  stream.reserve(size_t(param_floats * 4 * (asym ? 2 : 1) + w.rows * row_bytes));
  auto put = [&](const void* from, int64_t bytes) {
    stream.insert(stream.end(), static_cast<const uint8_t*>(from), static_cast<const uint8_t*>(from) + bytes);
  };
  const int64_t group_nibbles = kRowsPerBand * v.group_size / 2;
  for (int64_t j = 0; j < bands_end; j += kRowsPerBand) {
    for (int64_t gi = 0; gi < groups; ++gi) {
      put(w.scales + j * groups + gi * kRowsPerBand, kRowsPerBand * 4);
      if (asym) put(w.zeros + j * groups + gi * kRowsPerBand, kRowsPerBand * 4);
      put(data + j * row_bytes + gi * group_nibbles, group_nibbles);
    }
  }
  put(w.scales + bands_end * groups, tail * groups * 4);
  if (asym) put(w.zeros + bands_end * groups, tail * groups * 4);
  put(data + bands_end * row_bytes, tail * row_bytes);
  std::copy(stream.begin(), stream.end(), base);
  const int64_t band_bytes = kRowsPerBand * (groups * 4 * (asym ? 2 : 1) + row_bytes);
  w.data = base;
  w.scales = reinterpret_cast<const float*>(base + bands_end / kRowsPerBand * band_bytes);
  w.zeros = asym ? w.scales + tail * groups : nullptr;
  w.kernel_variant |= kBandStream;
}

WeightView i4_rows(const WeightView& w, int64_t r0, int64_t r1) {
  const I4Layout at(w);
  WeightView part = w;
  part.rows = r1 - r0;
  if (at.stream()) {  // bands one after another; the scales and zeros point at the tail rows', after them
    part.data = at.data + r0 / kRowsPerBand * at.band_bytes;
    return part;
  }
  part.data = at.data + r0 * at.row_bytes;  // bands in place (or rows), scales and zeros per row
  part.scales = w.scales + r0 * at.groups;
  if (w.zeros != nullptr) part.zeros = w.zeros + r0 * at.groups;
  return part;
}

void gemm_i4(const float* x, int64_t m, const WeightView& view, float* y) {
  const int32_t variant = view.kernel_variant & ~(kPackedBands | kBandStream);
  if (!simd_kernel(variant) && variant != kKernelReference) {
    throw Error("cpu gemm on i4: unknown kernel variant " + std::to_string(variant) +
                " (0 = auto, 2 = scalar reference, 3 = avx2, 4 = vnni)");
  }
  const bool vnni = vnni_for(variant, "i4");
  WeightView w = view;
  if (w.group_size <= 0) w.group_size = w.cols;  // one group per row
  if (m <= 0 || w.rows <= 0) return;
  const int64_t k = w.cols;
  const int64_t g = w.group_size;
  if (variant != kKernelReference && avx2_applies(w)) {
    // Up to kOwnQuantizeRows rows (decode), each thread quantizes x itself once its first lines are
    // requested (for_row_ranges's start), as the int8 GEMM does, rather than waiting for the caller
    // to; a batch is quantized once by the caller and shared read-only. int4 110m decode in the
    // minutes when the probe read 60-70 GB/s: median share 0.841 -> 0.855 (BM_DecodeRoofline/2,
    // 8 alternating pairs, all higher); from cache, 2 threads, 768x2048: 21 -> 13-16 us.
    const bool own = m <= kOwnQuantizeRows;
    thread_local QuantizedX xq;  // the caller's
    if (!own) quantize_x(x, m, k, g, xq);
    const QuantizedX& shared = xq;  // inside the region a thread_local name is the running thread's own
    static std::atomic<uint64_t> calls{0};
    const uint64_t call = ++calls;
    for_row_ranges(m, w, [&](int64_t j0, int64_t j1) {
      thread_local std::vector<uint8_t> scratch;  // each thread's split band
      thread_local QuantizedX mine;
      thread_local uint64_t mine_call = 0;
      if (own && mine_call != call) {
        quantize_x(x, m, k, g, mine);
        mine_call = call;
      }
      gemm_i4_avx2(own ? mine : shared, m, w, y, j0, j1, scratch, vnni);
    });
    return;
  }
  if ((w.kernel_variant & kPackedBands) != 0) throw Error("cpu gemm on i4: a packed view needs the AVX2 kernel");
  for_row_ranges(m, w, [&](int64_t j0, int64_t j1) { gemm_i4_scalar(x, m, w, y, j0, j1); });
}

}  // namespace tessera::cpu
