// Decoders of the GGUF block formats beyond Q8_0/Q4_0, for the GPU gemm (GEMV units, tiled staging)
// and the embedding. Layouts are ggml's, as core/src/gguf/block_formats.h and core/src/dtype_kquant.cpp
// read them on the CPU. Each format is a struct with
//   kElems, kBytes           elements and bytes of one block
//   sub32(blk, s, out)       the 32 elements 32s .. 32s + 31 of the block, in order
//   element(blk, e)          element e of the block alone
// Every function is host and device code and this header needs no GPU runtime, so a host test
// (tests/backends/gpu_block_decode_test.cpp) checks every decoder against the CPU's dequantize_row on
// machines without a GPU. Blocks are read with 16-bit loads at even offsets: every block size is even,
// so any 2-byte aligned row (as the Q8_0/Q4_0 decoders also assume) keeps them aligned.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__) || defined(__HIPCC__)
#include "../vendor.h"
#define TESSERA_HD __host__ __device__
#define TESSERA_UNROLL _Pragma("unroll")
#else
#define TESSERA_HD
#define TESSERA_UNROLL
#endif

#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
#define TESSERA_GGUF_DEVICE_PASS 1
#endif

namespace tessera::gpu::gguf {

TESSERA_HD inline uint16_t ld16(const uint8_t* p) {
#if defined(TESSERA_GGUF_DEVICE_PASS)
  return *reinterpret_cast<const uint16_t*>(p);
#else
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
#endif
}

TESSERA_HD inline uint32_t ld32(const uint8_t* p) { return uint32_t(ld16(p)) | (uint32_t(ld16(p + 2)) << 16); }

// IEEE half to float: the vendor conversion on the device; exact bit arithmetic on the host.
TESSERA_HD inline float fp16(const uint8_t* p) {
  const uint16_t h = ld16(p);
#if defined(TESSERA_GGUF_DEVICE_PASS)
  return half_bits_to_float(h);
#else
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    const float v = float(mant) * (1.0f / 16777216.0f);  // subnormal (or zero): mant * 2^-24, exact
    std::memcpy(&bits, &v, 4);
    bits |= sign;
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
#endif
}

// Products and sums rounded one at a time (never fused into an fma), as the CPU's dequantize_row
// rounds them: element() serves the embedding, whose rows must equal the CPU's bit for bit.
TESSERA_HD inline float mul(float a, float b) {
#if defined(TESSERA_GGUF_DEVICE_PASS)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
TESSERA_HD inline float add(float a, float b) {
#if defined(TESSERA_GGUF_DEVICE_PASS)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

// IQ4_NL's 16 levels (ggml's kvalues_iq4nl, tessera::kIq4NlValues) packed a byte each into two words,
// so a lookup is a shift in registers rather than a load from a table in memory.
constexpr uint64_t kIq4Lo = 0xF6EADDCFBFAD9881ull;  // -127 -104 -83 -65 -49 -35 -22 -10
constexpr uint64_t kIq4Hi = 0x7159453526190D01ull;  // 1 13 25 38 53 69 89 113
TESSERA_HD inline float iq4_level(int q) { return float(int8_t(((q < 8 ? kIq4Lo : kIq4Hi) >> (8 * (q & 7))) & 0xff)); }

// Q4_K/Q5_K: the 6-bit (scale, min) of sub-block j (0..7) in 12 bytes.
TESSERA_HD inline void scale_min_k4(int j, const uint8_t* s, int& scale, int& min) {
  if (j < 4) {
    scale = s[j] & 63;
    min = s[j + 4] & 63;
  } else {
    scale = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
    min = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// ---- blocks of 32 ----------------------------------------------------------------------------------

// Nibbles of a block of 32: element i in the low nibble of byte i, element i + 16 in its high nibble
// (plus, in the 5-bit formats, bit i of the u32 `high` as 16).
template <bool kFifth>
TESSERA_HD inline void nibbles32(const uint8_t* qs, uint32_t high, int (&q)[32]) {
  TESSERA_UNROLL
  for (int t = 0; t < 8; ++t) {
    const uint16_t b2 = ld16(qs + 2 * t);
    const int b0 = b2 & 0xff, b1 = b2 >> 8;
    q[2 * t] = b0 & 0x0f;
    q[2 * t + 1] = b1 & 0x0f;
    q[2 * t + 16] = b0 >> 4;
    q[2 * t + 17] = b1 >> 4;
  }
  if constexpr (kFifth) {
    TESSERA_UNROLL
    for (int i = 0; i < 32; ++i) q[i] |= int((high >> i) & 1u) << 4;
  }
}

TESSERA_HD inline int nibble32(const uint8_t* qs, int e) { return e < 16 ? (qs[e] & 0x0f) : (qs[e - 16] >> 4); }

// Q4_1 (20 B): fp16 d, fp16 m, 16 B nibbles; x = d·q + m.
struct Q4_1 {
  static constexpr int kElems = 32, kBytes = 20;
  TESSERA_HD static void sub32(const uint8_t* blk, int, float* out) {
    const float d = fp16(blk), m = fp16(blk + 2);
    int q[32];
    nibbles32<false>(blk + 4, 0, q);
    TESSERA_UNROLL
    for (int i = 0; i < 32; ++i) out[i] = d * float(q[i]) + m;
  }
  TESSERA_HD static float element(const uint8_t* blk, int e) {
    return add(mul(fp16(blk), float(nibble32(blk + 4, e))), fp16(blk + 2));
  }
};

// Q5_0 (22 B): fp16 d, u32 fifth bits, 16 B nibbles; x = d·(q - 16).
struct Q5_0 {
  static constexpr int kElems = 32, kBytes = 22;
  TESSERA_HD static void sub32(const uint8_t* blk, int, float* out) {
    const float d = fp16(blk);
    int q[32];
    nibbles32<true>(blk + 6, ld32(blk + 2), q);
    TESSERA_UNROLL
    for (int i = 0; i < 32; ++i) out[i] = d * float(q[i] - 16);
  }
  TESSERA_HD static float element(const uint8_t* blk, int e) {
    const int q = nibble32(blk + 6, e) | int((ld32(blk + 2) >> e) & 1u) << 4;
    return mul(fp16(blk), float(q - 16));
  }
};

// Q5_1 (24 B): fp16 d, fp16 m, u32 fifth bits, 16 B nibbles; x = d·q + m.
struct Q5_1 {
  static constexpr int kElems = 32, kBytes = 24;
  TESSERA_HD static void sub32(const uint8_t* blk, int, float* out) {
    const float d = fp16(blk), m = fp16(blk + 2);
    int q[32];
    nibbles32<true>(blk + 8, ld32(blk + 4), q);
    TESSERA_UNROLL
    for (int i = 0; i < 32; ++i) out[i] = d * float(q[i]) + m;
  }
  TESSERA_HD static float element(const uint8_t* blk, int e) {
    const int q = nibble32(blk + 8, e) | int((ld32(blk + 4) >> e) & 1u) << 4;
    return add(mul(fp16(blk), float(q)), fp16(blk + 2));
  }
};

// IQ4_NL (18 B): fp16 d, 16 B nibbles indexing the levels; x = d·level[q].
struct Iq4Nl {
  static constexpr int kElems = 32, kBytes = 18;
  TESSERA_HD static void sub32(const uint8_t* blk, int, float* out) {
    const float d = fp16(blk);
    int q[32];
    nibbles32<false>(blk + 2, 0, q);
    TESSERA_UNROLL
    for (int i = 0; i < 32; ++i) out[i] = d * iq4_level(q[i]);
  }
  TESSERA_HD static float element(const uint8_t* blk, int e) { return mul(fp16(blk), iq4_level(nibble32(blk + 2, e))); }
};

// ---- super-blocks of 256 (eight sub-blocks of 32) ---------------------------------------------------

// Q2_K (84 B): 16 B (scale | min << 4) per 16 elements, 64 B 2-bit quants, fp16 d, fp16 dmin.
// Sub-block s = 4h + p (h half, p bit pair): element l is bits 2p..2p+1 of quant byte 32h + l, with
// the scale byte 2s + l / 16; x = d·(sc & 15)·q - dmin·(sc >> 4).
struct Q2_K {
  static constexpr int kElems = 256, kBytes = 84;
  TESSERA_HD static void sub32(const uint8_t* blk, int s, float* out) {
    const float d = fp16(blk + 80), dmin = fp16(blk + 82);
    const uint8_t* qs = blk + 16 + 32 * (s / 4);
    const int shift = 2 * (s % 4);
    const uint16_t sc2 = ld16(blk + 2 * s);
    const float dl[2] = {d * float(sc2 & 0x0f), d * float((sc2 >> 8) & 0x0f)};
    const float ml[2] = {dmin * float((sc2 >> 4) & 0x0f), dmin * float(sc2 >> 12)};
    TESSERA_UNROLL
    for (int t = 0; t < 16; ++t) {
      const uint16_t b2 = ld16(qs + 2 * t);
      const int l = 2 * t, half = l / 16;
      out[l] = dl[half] * float(((b2 & 0xff) >> shift) & 3) - ml[half];
      out[l + 1] = dl[half] * float(((b2 >> 8) >> shift) & 3) - ml[half];
    }
  }
  TESSERA_HD static float element(const uint8_t* blk, int e) {
    const int s = e / 32, l = e % 32;
    const int q = (blk[16 + 32 * (s / 4) + l] >> (2 * (s % 4))) & 3;
    const uint8_t sc = blk[e / 16];
    return add(mul(mul(fp16(blk + 80), float(sc & 0x0f)), float(q)), -mul(fp16(blk + 82), float(sc >> 4)));
  }
};

// Q3_K: scale j (0..15) of the 12 bytes as stored (the value is this - 32).
TESSERA_HD inline int q3k_scale(int j, const uint8_t* s) {
  const int low = j < 8 ? s[j] & 0x0f : s[j - 8] >> 4;
  return low | (((s[8 + j % 4] >> (2 * (j / 4))) & 3) << 4);
}

// Q3_K (110 B): 32 B high-bit mask, 64 B 2-bit quants, 12 B 6-bit scales, fp16 d. As Q2_K's quants,
// minus 4 where bit s of mask byte l is clear; x = d·(sc - 32)·q.
struct Q3_K {
  static constexpr int kElems = 256, kBytes = 110;
  TESSERA_HD static void sub32(const uint8_t* blk, int s, float* out) {
    const float d = fp16(blk + 108);
    const uint8_t* qs = blk + 32 + 32 * (s / 4);
    const int shift = 2 * (s % 4);
    const float dl[2] = {d * float(q3k_scale(2 * s, blk + 96) - 32), d * float(q3k_scale(2 * s + 1, blk + 96) - 32)};
    TESSERA_UNROLL
    for (int t = 0; t < 16; ++t) {
      const uint16_t b2 = ld16(qs + 2 * t), h2 = ld16(blk + 2 * t);
      const int l = 2 * t, half = l / 16;
      const int q0 = (((b2 & 0xff) >> shift) & 3) - (((h2 & 0xff) >> s) & 1 ? 0 : 4);
      const int q1 = (((b2 >> 8) >> shift) & 3) - (((h2 >> 8) >> s) & 1 ? 0 : 4);
      out[l] = dl[half] * float(q0);
      out[l + 1] = dl[half] * float(q1);
    }
  }
  TESSERA_HD static float element(const uint8_t* blk, int e) {
    const int s = e / 32, l = e % 32;
    const int q = ((blk[32 + 32 * (s / 4) + l] >> (2 * (s % 4))) & 3) - ((blk[l] >> s) & 1 ? 0 : 4);
    return mul(mul(fp16(blk + 108), float(q3k_scale(e / 16, blk + 96) - 32)), float(q));
  }
};

// Q4_K (144 B): fp16 d, fp16 dmin, 12 B scales/mins, 128 B nibbles. Sub-block s is the low (even s)
// or high (odd s) nibbles of bytes 32(s / 2) .. +31; x = d·sc·q - dmin·min.
struct Q4_K {
  static constexpr int kElems = 256, kBytes = 144;
  TESSERA_HD static void sub32(const uint8_t* blk, int s, float* out) {
    int sc, mn;
    scale_min_k4(s, blk + 4, sc, mn);
    const float dl = fp16(blk) * float(sc), ml = fp16(blk + 2) * float(mn);
    const uint8_t* qs = blk + 16 + 32 * (s / 2);
    const int shift = 4 * (s % 2);
    TESSERA_UNROLL
    for (int t = 0; t < 16; ++t) {
      const uint16_t b2 = ld16(qs + 2 * t);
      out[2 * t] = dl * float(((b2 & 0xff) >> shift) & 0x0f) - ml;
      out[2 * t + 1] = dl * float(((b2 >> 8) >> shift) & 0x0f) - ml;
    }
  }
  TESSERA_HD static float element(const uint8_t* blk, int e) {
    const int s = e / 32, l = e % 32;
    int sc, mn;
    scale_min_k4(s, blk + 4, sc, mn);
    const int q = (blk[16 + 32 * (s / 2) + l] >> (4 * (s % 2))) & 0x0f;
    return add(mul(mul(fp16(blk), float(sc)), float(q)), -mul(fp16(blk + 2), float(mn)));
  }
};

// Q5_K (176 B): Q4_K's fields, then 32 B fifth bits before the 128 B nibbles; element l of
// sub-block s adds bit s of fifth-bit byte l as 16.
struct Q5_K {
  static constexpr int kElems = 256, kBytes = 176;
  TESSERA_HD static void sub32(const uint8_t* blk, int s, float* out) {
    int sc, mn;
    scale_min_k4(s, blk + 4, sc, mn);
    const float dl = fp16(blk) * float(sc), ml = fp16(blk + 2) * float(mn);
    const uint8_t* qs = blk + 48 + 32 * (s / 2);
    const int shift = 4 * (s % 2);
    TESSERA_UNROLL
    for (int t = 0; t < 16; ++t) {
      const uint16_t b2 = ld16(qs + 2 * t), h2 = ld16(blk + 16 + 2 * t);
      const int q0 = (((b2 & 0xff) >> shift) & 0x0f) | ((((h2 & 0xff) >> s) & 1) << 4);
      const int q1 = (((b2 >> 8) >> shift) & 0x0f) | ((((h2 >> 8) >> s) & 1) << 4);
      out[2 * t] = dl * float(q0) - ml;
      out[2 * t + 1] = dl * float(q1) - ml;
    }
  }
  TESSERA_HD static float element(const uint8_t* blk, int e) {
    const int s = e / 32, l = e % 32;
    int sc, mn;
    scale_min_k4(s, blk + 4, sc, mn);
    const int q = ((blk[48 + 32 * (s / 2) + l] >> (4 * (s % 2))) & 0x0f) | (((blk[16 + l] >> s) & 1) << 4);
    return add(mul(mul(fp16(blk), float(sc)), float(q)), -mul(fp16(blk + 2), float(mn)));
  }
};

// Q6_K (210 B): 128 B low nibbles, 64 B high bit pairs, 16 int8 scales, fp16 d. Sub-block s = 4h + g
// (h half, g 0..3): element l is the low (g < 2) or high nibble of low byte 64h + 32(g % 2) + l, with
// bits 2g..2g+1 of high byte 32h + l, minus 32, times scale 8h + 2g + l / 16.
struct Q6_K {
  static constexpr int kElems = 256, kBytes = 210;
  TESSERA_HD static void sub32(const uint8_t* blk, int s, float* out) {
    const int h = s / 4, g = s % 4;
    const float d = fp16(blk + 208);
    const uint8_t* ql = blk + 64 * h + 32 * (g % 2);
    const uint8_t* qh = blk + 128 + 32 * h;
    const uint16_t sc2 = ld16(blk + 192 + 8 * h + 2 * g);
    const int sc[2] = {int(int8_t(sc2 & 0xff)), int(int8_t(sc2 >> 8))};
    const int lo_shift = 4 * (g / 2), hi_shift = 2 * g;
    TESSERA_UNROLL
    for (int t = 0; t < 16; ++t) {
      const uint16_t l2 = ld16(ql + 2 * t), h2 = ld16(qh + 2 * t);
      const int l = 2 * t, half = l / 16;
      const int q0 = ((((l2 & 0xff) >> lo_shift) & 0x0f) | ((((h2 & 0xff) >> hi_shift) & 3) << 4)) - 32;
      const int q1 = ((((l2 >> 8) >> lo_shift) & 0x0f) | ((((h2 >> 8) >> hi_shift) & 3) << 4)) - 32;
      out[l] = d * float(sc[half] * q0);
      out[l + 1] = d * float(sc[half] * q1);
    }
  }
  TESSERA_HD static float element(const uint8_t* blk, int e) {
    const int s = e / 32, l = e % 32, h = s / 4, g = s % 4;
    const int q = (((blk[64 * h + 32 * (g % 2) + l] >> (4 * (g / 2))) & 0x0f) |
                   (((blk[128 + 32 * h + l] >> (2 * g)) & 3) << 4)) - 32;
    const int sc = int8_t(blk[192 + 8 * h + 2 * g + l / 16]);
    return mul(fp16(blk + 208), float(sc * q));
  }
};

// IQ4_XS (136 B): fp16 d, u16 scale high bits, 4 B scale low nibbles, 128 B nibbles; sub-block s is
// IQ4_NL's nibble layout in bytes 8 + 16s .. +15 with scale d·(ls - 32).
struct Iq4Xs {
  static constexpr int kElems = 256, kBytes = 136;
  TESSERA_HD static int scale(const uint8_t* blk, int s) {
    return ((blk[4 + s / 2] >> (4 * (s % 2))) & 0x0f) | (((ld16(blk + 2) >> (2 * s)) & 3) << 4);
  }
  TESSERA_HD static void sub32(const uint8_t* blk, int s, float* out) {
    const float dl = fp16(blk) * float(scale(blk, s) - 32);
    int q[32];
    nibbles32<false>(blk + 8 + 16 * s, 0, q);
    TESSERA_UNROLL
    for (int i = 0; i < 32; ++i) out[i] = dl * iq4_level(q[i]);
  }
  TESSERA_HD static float element(const uint8_t* blk, int e) {
    const int s = e / 32;
    return mul(mul(fp16(blk), float(scale(blk, s) - 32)), iq4_level(nibble32(blk + 8 + 16 * s, e % 32)));
  }
};

// ---- grid formats of 256: IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S ------------------------------------
// Each super-block is 32 groups of 8; group g has 8 magnitudes from a codebook entry, 8 signs and an
// odd scale 2l + 1; x = (d·factor·scale)·magnitude, negated where the sign bit is set (the order of
// core/src/gguf/dtype_iq23.cpp). The codebooks and ggml's sign table (tessera/iq_grids.h) live in one
// device buffer the backend uploads (iq_tables.h fills it), at these byte offsets:
struct IqTables {
  static constexpr int kIq2Xxs = 0;       // 256 x u64
  static constexpr int kIq2Xs = 2048;     // 512 x u64
  static constexpr int kIq2S = 6144;      // 1024 x u64
  static constexpr int kIq3Xxs = 14336;   // 256 x u32
  static constexpr int kIq3S = 15360;     // 512 x u32
  static constexpr int kSigns = 17408;    // 128 x u8: 7 stored sign bits -> 8 with an even count
  static constexpr int kBytes = 17536;
};

TESSERA_HD inline uint64_t grid64(const uint8_t* tables, int offset, int i) {
  return reinterpret_cast<const uint64_t*>(tables + offset)[i];
}
TESSERA_HD inline uint64_t grid32(const uint8_t* tables, int offset, int i) {
  return reinterpret_cast<const uint32_t*>(tables + offset)[i];
}

struct IqGroup8 {
  uint64_t mags;  // byte i: magnitude of element i
  uint32_t signs;
  int scale;
};

// Group g (0..31) of each format; sub-block ib = g / 4 and l = g % 4 within it.
struct Iq2XxsLayout {  // 66 B: fp16 d, per 32: u32 four grid indices, u32 four 7-bit signs | scale << 28
  static constexpr int kBytes = 66;
  static constexpr float kFactor = 0.125f;
  TESSERA_HD static IqGroup8 group(const uint8_t* blk, int g, const uint8_t* t) {
    const int ib = g / 4, l = g % 4;
    const uint32_t idx = ld32(blk + 2 + 8 * ib), sgn = ld32(blk + 6 + 8 * ib);
    return {grid64(t, IqTables::kIq2Xxs, (idx >> (8 * l)) & 255), t[IqTables::kSigns + ((sgn >> (7 * l)) & 127)],
            int(2 * (sgn >> 28) + 1)};
  }
};
struct Iq2XsLayout {  // 74 B: fp16 d, 32 x u16 (9-bit index | 7-bit signs << 9), 8 B scale nibbles
  static constexpr int kBytes = 74;
  static constexpr float kFactor = 0.125f;
  TESSERA_HD static IqGroup8 group(const uint8_t* blk, int g, const uint8_t* t) {
    const int ib = g / 4, l = g % 4;
    const uint16_t q = ld16(blk + 2 + 2 * g);
    return {grid64(t, IqTables::kIq2Xs, q & 511), t[IqTables::kSigns + (q >> 9)],
            2 * ((blk[66 + ib] >> (4 * (l / 2))) & 15) + 1};
  }
};
struct Iq2SLayout {  // 82 B: fp16 d, 32 B index low bytes, 32 B signs, 8 B index high bits, 8 B scales
  static constexpr int kBytes = 82;
  static constexpr float kFactor = 0.125f;
  TESSERA_HD static IqGroup8 group(const uint8_t* blk, int g, const uint8_t* t) {
    const int ib = g / 4, l = g % 4;
    const int idx = blk[2 + g] | (((blk[66 + ib] >> (2 * l)) & 3) << 8);
    return {grid64(t, IqTables::kIq2S, idx), blk[34 + g], 2 * ((blk[74 + ib] >> (4 * (l / 2))) & 15) + 1};
  }
};
struct Iq3XxsLayout {  // 98 B: fp16 d, 64 B grid indices (two per group), per 32: u32 signs | scale << 28
  static constexpr int kBytes = 98;
  static constexpr float kFactor = 0.25f;
  TESSERA_HD static IqGroup8 group(const uint8_t* blk, int g, const uint8_t* t) {
    const int ib = g / 4, l = g % 4;
    const uint8_t* qs = blk + 2 + 8 * ib + 2 * l;
    const uint32_t sgn = ld32(blk + 66 + 4 * ib);
    return {grid32(t, IqTables::kIq3Xxs, qs[0]) | grid32(t, IqTables::kIq3Xxs, qs[1]) << 32,
            t[IqTables::kSigns + ((sgn >> (7 * l)) & 127)], int(2 * (sgn >> 28) + 1)};
  }
};
struct Iq3SLayout {  // 110 B: fp16 d, 64 B index low bytes, 8 B index high bits, 32 B signs, 4 B scales
  static constexpr int kBytes = 110;
  static constexpr float kFactor = 1.0f;
  TESSERA_HD static IqGroup8 group(const uint8_t* blk, int g, const uint8_t* t) {
    const int ib = g / 4, l = g % 4;
    const uint8_t* qs = blk + 2 + 8 * ib + 2 * l;
    const int high = blk[66 + ib] >> (2 * l);
    return {grid32(t, IqTables::kIq3S, qs[0] | ((high & 1) << 8)) |
                grid32(t, IqTables::kIq3S, qs[1] | ((high & 2) << 7)) << 32,
            blk[74 + g], 2 * ((blk[106 + ib / 2] >> (4 * (ib % 2))) & 15) + 1};
  }
};

// A grid format: as the structs above, with the tables buffer as a last argument.
template <class L>
struct IqGrid {
  static constexpr int kElems = 256, kBytes = L::kBytes;
  TESSERA_HD static void sub32(const uint8_t* blk, int s, float* out, const uint8_t* tables) {
    const float d = mul(fp16(blk), L::kFactor);
    TESSERA_UNROLL
    for (int l = 0; l < 4; ++l) {
      const IqGroup8 q = L::group(blk, 4 * s + l, tables);
      const float db = mul(d, float(q.scale));
      TESSERA_UNROLL
      for (int i = 0; i < 8; ++i) {
        const float v = mul(db, float(int((q.mags >> (8 * i)) & 255)));
        out[8 * l + i] = (q.signs >> i) & 1 ? -v : v;
      }
    }
  }
  TESSERA_HD static float element(const uint8_t* blk, int e, const uint8_t* tables) {
    const IqGroup8 q = L::group(blk, e / 8, tables);
    const float v = mul(mul(mul(fp16(blk), L::kFactor), float(q.scale)), float(int((q.mags >> (8 * (e % 8))) & 255)));
    return (q.signs >> (e % 8)) & 1 ? -v : v;
  }
};
using Iq2Xxs = IqGrid<Iq2XxsLayout>;
using Iq2Xs = IqGrid<Iq2XsLayout>;
using Iq2S = IqGrid<Iq2SLayout>;
using Iq3Xxs = IqGrid<Iq3XxsLayout>;
using Iq3S = IqGrid<Iq3SLayout>;

// Element c of a row of format B.
template <class B>
TESSERA_HD inline float row_element(const uint8_t* row, int64_t c) {
  return B::element(row + (c / B::kElems) * B::kBytes, int(c % B::kElems));
}

// The 32 elements 32u .. 32u + 31 of a row of format B.
template <class B>
TESSERA_HD inline void row_unit32(const uint8_t* row, int64_t u, float* out) {
  constexpr int kSubs = B::kElems / 32;
  B::sub32(row + (u / kSubs) * B::kBytes, int(u % kSubs), out);
}

// The same for the grid formats, which read the tables.
template <class B>
TESSERA_HD inline float row_element(const uint8_t* row, int64_t c, const uint8_t* tables) {
  return B::element(row + (c / 256) * B::kBytes, int(c % 256), tables);
}
template <class B>
TESSERA_HD inline void row_unit32(const uint8_t* row, int64_t u, float* out, const uint8_t* tables) {
  B::sub32(row + (u / 8) * B::kBytes, int(u % 8), out, tables);
}

}  // namespace tessera::gpu::gguf
