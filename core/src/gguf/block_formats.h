// Internal to tessera_core: the GGUF block formats added beside Q8_0/Q4_0/Q4_K/Q6_K, their shared
// bit helpers, and the per-family entry points dtype.cpp and quantize_blocks.cpp dispatch to.
// Layouts (ggml's, byte offsets within a block):
//   Q4_1   (32, 20 B)  fp16 d, fp16 m, 16 B nibbles                 x = d·q + m
//   Q5_0   (32, 22 B)  fp16 d, u32 fifth bits, 16 B nibbles          x = d·(q - 16)
//   Q5_1   (32, 24 B)  fp16 d, fp16 m, u32 fifth bits, 16 B nibbles  x = d·q + m
//   IQ4_NL (32, 18 B)  fp16 d, 16 B nibbles indexing kIq4NlValues    x = d·table[q]
//     (element i in the low nibble of byte i, i + 16 in its high nibble; fifth bit i of the u32)
//   Q2_K  (256, 84 B)  16 B (scale | min << 4) per 16, 64 B 2-bit quants, fp16 d, fp16 dmin
//   Q3_K (256, 110 B)  32 B high-bit mask, 64 B 2-bit quants, 12 B 6-bit scales, fp16 d
//   Q5_K (256, 176 B)  fp16 d, fp16 dmin, 12 B 6-bit scales/mins (Q4_K's), 32 B fifth bits, 128 B nibbles
//   IQ4_XS (256, 136 B) fp16 d, u16 scale high bits, 4 B scale low nibbles, 128 B nibbles
// The grid formats (256; tessera/iq_grids.h), per 32 elements: 4 groups of 8, each a grid entry
// (IQ3: two of 4) and 8 sign bits; scale codes l are 4 bits:
//   IQ2_XXS (66 B)  fp16 d, then per 32 a u32 of 4 index bytes and a u32 of 4 x 7 sign bits | l << 28;
//                   x = d·(2l+1)/8 · g
//   IQ2_XS  (74 B)  fp16 d, 32 u16 (9-bit index | 7 sign bits << 9), 8 B of l per 16 (low nibble first);
//                   x = d·(2l+1)/8 · g
//   IQ2_S   (82 B)  fp16 d, 32 B index low bytes, 32 B signs, 8 B index high bits (2 per group),
//                   8 B of l per 16;  x = d·(2l+1)/8 · g
//   IQ3_XXS (98 B)  fp16 d, 64 B indices (4 elements each), 8 u32 of 4 x 7 sign bits | l << 28;
//                   x = d·(2l+1)/4 · g
//   IQ3_S  (110 B)  fp16 d, 64 B index low bytes, 8 B index ninth bits, 32 B signs, 4 B of l per 32;
//                   x = d·(2l+1) · g
// In Q2_K and Q3_K, element 128h + 32s + l (h half, s shift, l < 32) is bits 2s..2s+1 of quant
// byte 32h + l and takes the scale of its 16: 8h + 2s + l/16; Q3_K's high bit is bit 4h + s of
// mask byte l (set: q, clear: q - 4).
#pragma once

#include <cstdint>
#include <cstring>

#include "tessera/dtype.h"

namespace tessera::gguf_blocks {

inline float load_fp16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);  // blocks inside a file are not 2-byte aligned in general
  return fp16_to_f32(h);
}

inline void store_fp16(uint8_t* p, float v) {
  const uint16_t h = f32_to_fp16(v);
  std::memcpy(p, &h, 2);
}

// Q4_K/Q5_K: entry j (0..7) of the 12-byte 6-bit (scale, min) pairs.
inline void scale_min_k4(int j, const uint8_t* s, int& scale, int& min) {
  if (j < 4) {
    scale = s[j] & 63;
    min = s[j + 4] & 63;
  } else {
    scale = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
    min = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Q3_K: scale j (0..15) of the 12 bytes, as stored (0..63; the value is this - 32). Low 4 bits:
// the low (j < 8) or high nibble of byte j % 8; top 2 bits: bit pair j / 4 of byte 8 + j % 4.
inline int q3k_scale(int j, const uint8_t* s) {
  const int low = j < 8 ? s[j] & 0x0f : s[j - 8] >> 4;
  return low | (((s[8 + j % 4] >> (2 * (j / 4))) & 3) << 4);
}

// IQ4_XS: the 6-bit scale of sub-block j (0..7); the value is this - 32.
inline int iq4xs_scale(int j, const uint8_t* blk) {
  uint16_t h;
  std::memcpy(&h, blk + 2, 2);
  return ((blk[4 + j / 2] >> (4 * (j % 2))) & 0x0f) | (((h >> (2 * j)) & 3) << 4);
}

// Rows of n elements (n a whole number of blocks, checked by the caller).
void dequantize_block32_row(DType t, const uint8_t* src, float* dst, int64_t n);    // Q4_1 Q5_0 Q5_1 IQ4_NL
void dequantize_superblock_row(DType t, const uint8_t* src, float* dst, int64_t n);  // Q2_K Q3_K Q5_K IQ4_XS
void quantize_legacy_row(DType t, const float* src, uint8_t* dst, int64_t n);       // Q4_1 Q5_0 Q5_1
void quantize_kquant_row(DType t, const float* src, uint8_t* dst, int64_t n);       // Q2_K..Q6_K
void quantize_iq4_row(DType t, const float* src, uint8_t* dst, int64_t n);          // IQ4_NL IQ4_XS
// IQ2_XXS IQ2_XS IQ2_S IQ3_XXS IQ3_S (dtype_iq23.cpp, quantize_iq23.cpp)
void dequantize_iq23_row(DType t, const uint8_t* src, float* dst, int64_t n);
void quantize_iq23_row(DType t, const float* src, uint8_t* dst, int64_t n);

}  // namespace tessera::gguf_blocks
