// Dequantization of the GGUF super-blocks of 256 beside Q4_K/Q6_K: Q2_K, Q3_K, Q5_K and IQ4_XS
// (layouts in block_formats.h).
#include <string>

#include "block_formats.h"
#include "tessera/error.h"

namespace tessera::gguf_blocks {

namespace {

// x = d·(sc & 15)·q - dmin·(sc >> 4), q two bits.
void dequantize_q2_k(const uint8_t* src, float* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, src += 84, dst += 256) {
    const uint8_t* sc = src;
    const uint8_t* qs = src + 16;
    const float d = load_fp16(src + 80), dmin = load_fp16(src + 82);
    for (int i = 0; i < 256; ++i) {
      const int h = i / 128, s = (i % 128) / 32, l = i % 32;
      const int q = (qs[32 * h + l] >> (2 * s)) & 3;
      const uint8_t scale = sc[8 * h + 2 * s + l / 16];
      dst[i] = d * float(scale & 0x0f) * float(q) - dmin * float(scale >> 4);
    }
  }
}

// x = d·(sc - 32)·(q - 4·(1 - high bit)), q two bits.
void dequantize_q3_k(const uint8_t* src, float* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, src += 110, dst += 256) {
    const uint8_t* hmask = src;
    const uint8_t* qs = src + 32;
    const uint8_t* scales = src + 96;
    const float d = load_fp16(src + 108);
    int sc[16];
    for (int j = 0; j < 16; ++j) sc[j] = q3k_scale(j, scales) - 32;
    for (int i = 0; i < 256; ++i) {
      const int h = i / 128, s = (i % 128) / 32, l = i % 32;
      const int q = ((qs[32 * h + l] >> (2 * s)) & 3) - ((hmask[l] >> (4 * h + s)) & 1 ? 0 : 4);
      dst[i] = d * float(sc[8 * h + 2 * s + l / 16]) * float(q);
    }
  }
}

// As Q4_K with a fifth bit: element 64c + l (l < 32) is the low nibble of byte 32c + l with bit 2c
// of fifth-bit byte l; element 64c + 32 + l its high nibble with bit 2c + 1.
void dequantize_q5_k(const uint8_t* src, float* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, src += 176, dst += 256) {
    const float d = load_fp16(src), dmin = load_fp16(src + 2);
    const uint8_t* scales = src + 4;
    const uint8_t* qh = src + 16;
    const uint8_t* qs = src + 48;
    for (int c = 0; c < 4; ++c) {
      int sc0, m0, sc1, m1;
      scale_min_k4(2 * c, scales, sc0, m0);
      scale_min_k4(2 * c + 1, scales, sc1, m1);
      const float d0 = d * float(sc0), o0 = dmin * float(m0), d1 = d * float(sc1), o1 = dmin * float(m1);
      for (int l = 0; l < 32; ++l) {
        const int q0 = (qs[32 * c + l] & 0x0f) | (((qh[l] >> (2 * c)) & 1) << 4);
        const int q1 = (qs[32 * c + l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4);
        dst[64 * c + l] = d0 * float(q0) - o0;
        dst[64 * c + 32 + l] = d1 * float(q1) - o1;
      }
    }
  }
}

// Eight sub-blocks of 32, each IQ4_NL's nibble layout with scale d·(ls - 32).
void dequantize_iq4_xs(const uint8_t* src, float* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, src += 136, dst += 256) {
    const float d = load_fp16(src);
    for (int j = 0; j < 8; ++j) {
      const float dl = d * float(iq4xs_scale(j, src) - 32);
      const uint8_t* qs = src + 8 + 16 * j;
      for (int i = 0; i < 16; ++i) {
        dst[32 * j + i] = dl * float(kIq4NlValues[qs[i] & 0x0f]);
        dst[32 * j + 16 + i] = dl * float(kIq4NlValues[qs[i] >> 4]);
      }
    }
  }
}

}  // namespace

void dequantize_superblock_row(DType t, const uint8_t* src, float* dst, int64_t n) {
  const int64_t nb = n / 256;
  switch (t) {
    case DType::Q2_K: return dequantize_q2_k(src, dst, nb);
    case DType::Q3_K: return dequantize_q3_k(src, dst, nb);
    case DType::Q5_K: return dequantize_q5_k(src, dst, nb);
    case DType::IQ4_XS: return dequantize_iq4_xs(src, dst, nb);
    default: break;
  }
  throw Error("dequantize_superblock_row: " + std::string(dtype_name(t)) + " is not Q2_K, Q3_K, Q5_K or IQ4_XS");
}

}  // namespace tessera::gguf_blocks
