// Dequantization of the ggml k-quant super-blocks (256 elements each) used by GGUF files.
#include <cstring>
#include <string>

#include "tessera/dtype.h"
#include "tessera/error.h"

namespace tessera {

namespace {

constexpr int kSuperBlock = 256;

float load_fp16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);  // memcpy: blocks inside a file are not 2-byte aligned in general
  return fp16_to_f32(h);
}

// Q4_K packs 8 pairs of 6-bit (scale, min) into 12 bytes: entries 0..3 sit in the low 6 bits of
// bytes 0..3 (scales) and 4..7 (mins); entries 4..7 keep their low 4 bits in bytes 8..11 and their
// top 2 bits in the spare high bits of bytes 0..7.
void q4k_scale_min(int j, const uint8_t* s, int& scale, int& min) {
  if (j < 4) {
    scale = s[j] & 63;
    min = s[j + 4] & 63;
  } else {
    scale = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
    min = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Layout (144 bytes): fp16 d, fp16 dmin, 12 bytes scales/mins, 128 bytes of nibbles.
// Each 64-element chunk uses 32 bytes: low nibbles give elements 0..31 (sub-block 2c),
// high nibbles give elements 32..63 (sub-block 2c+1). x = d*scale*q - dmin*min.
void dequantize_q4_k(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kSuperBlock; ++b, src += 144) {
    const float d = load_fp16(src);
    const float dmin = load_fp16(src + 2);
    const uint8_t* scales = src + 4;
    const uint8_t* qs = src + 16;
    float* y = dst + b * kSuperBlock;
    for (int chunk = 0; chunk < 4; ++chunk) {
      int sc_lo, m_lo, sc_hi, m_hi;
      q4k_scale_min(2 * chunk, scales, sc_lo, m_lo);
      q4k_scale_min(2 * chunk + 1, scales, sc_hi, m_hi);
      const float d_lo = d * static_cast<float>(sc_lo), off_lo = dmin * static_cast<float>(m_lo);
      const float d_hi = d * static_cast<float>(sc_hi), off_hi = dmin * static_cast<float>(m_hi);
      const uint8_t* q = qs + 32 * chunk;
      for (int l = 0; l < 32; ++l) {
        y[64 * chunk + l] = d_lo * static_cast<float>(q[l] & 0x0f) - off_lo;
        y[64 * chunk + 32 + l] = d_hi * static_cast<float>(q[l] >> 4) - off_hi;
      }
    }
  }
}

// Layout (210 bytes): ql[128] low 4 bits, qh[64] high 2 bits, int8 scales[16] (one per 16
// elements), fp16 d. Each 128-element half uses 64 ql bytes and 32 qh bytes; for l in 0..31 the
// four values l, l+32, l+64, l+96 share qh[l] (bit pairs 0-1, 2-3, 4-5, 6-7).
void dequantize_q6_k(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / kSuperBlock; ++b, src += 210) {
    const uint8_t* ql = src;
    const uint8_t* qh = src + 128;
    const auto* sc = reinterpret_cast<const int8_t*>(src + 192);
    const float d = load_fp16(src + 208);
    float* y = dst + b * kSuperBlock;
    for (int half = 0; half < 2; ++half, ql += 64, qh += 32, sc += 8, y += 128) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q0 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q1 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q2 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q3 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        // (d·sc)·q in f32, ggml's order, so that values equal its dequantization bit for bit.
        y[l] = d * static_cast<float>(sc[is + 0]) * static_cast<float>(q0);
        y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q1);
        y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q2);
        y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q3);
      }
    }
  }
}

}  // namespace

void dequantize_kquant_row(DType t, const uint8_t* src, float* dst, int64_t n) {
  if (n < 0 || n % kSuperBlock != 0) {
    throw Error("a row of " + std::to_string(n) + " elements is not a whole number of " +
                std::string(dtype_name(t)) + " super-blocks (256 each)");
  }
  switch (t) {
    case DType::Q4_K: dequantize_q4_k(src, dst, n); return;
    case DType::Q6_K: dequantize_q6_k(src, dst, n); return;
    default: break;
  }
  throw Error("dequantize_kquant_row: " + std::string(dtype_name(t)) + " is not a k-quant type");
}

}  // namespace tessera
