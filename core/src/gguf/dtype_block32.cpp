// Dequantization of the GGUF blocks of 32 beside Q8_0/Q4_0: Q4_1, Q5_0, Q5_1 and IQ4_NL (layouts in
// block_formats.h). Element i of a block sits in the low nibble of byte i, element i + 16 in its
// high nibble; a fifth bit, where there is one, is bit i of the block's u32.
#include <string>

#include "block_formats.h"
#include "tessera/error.h"

namespace tessera::gguf_blocks {

namespace {

uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// x = d·(q + bias) + m over nb blocks, with q the nibble plus 16 times the fifth bit if any.
template <bool kMin, bool kFifth>
void dequantize(const uint8_t* src, float* dst, int64_t nb, size_t block_bytes, int bias) {
  for (int64_t b = 0; b < nb; ++b, src += block_bytes, dst += 32) {
    const float d = load_fp16(src);
    const float m = kMin ? load_fp16(src + 2) : 0.0f;
    const uint8_t* p = src + (kMin ? 4 : 2);
    const uint32_t high = kFifth ? load_u32(p) : 0;
    const uint8_t* qs = p + (kFifth ? 4 : 0);
    for (int i = 0; i < 16; ++i) {
      const int q0 = (qs[i] & 0x0f) | int(((high >> i) & 1) << 4);
      const int q1 = (qs[i] >> 4) | int(((high >> (i + 16)) & 1) << 4);
      // No "+ 0" without a min: it would turn ggml's -0.0 (a zero block's negative d) into +0.0.
      dst[i] = kMin ? d * float(q0 + bias) + m : d * float(q0 + bias);
      dst[i + 16] = kMin ? d * float(q1 + bias) + m : d * float(q1 + bias);
    }
  }
}

void dequantize_iq4_nl(const uint8_t* src, float* dst, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, src += 18, dst += 32) {
    const float d = load_fp16(src);
    for (int i = 0; i < 16; ++i) {
      dst[i] = d * float(kIq4NlValues[src[2 + i] & 0x0f]);
      dst[i + 16] = d * float(kIq4NlValues[src[2 + i] >> 4]);
    }
  }
}

}  // namespace

void dequantize_block32_row(DType t, const uint8_t* src, float* dst, int64_t n) {
  const int64_t nb = n / 32;
  switch (t) {
    case DType::Q4_1: return dequantize<true, false>(src, dst, nb, 20, 0);
    case DType::Q5_0: return dequantize<false, true>(src, dst, nb, 22, -16);
    case DType::Q5_1: return dequantize<true, true>(src, dst, nb, 24, 0);
    case DType::IQ4_NL: return dequantize_iq4_nl(src, dst, nb);
    default: break;
  }
  throw Error("dequantize_block32_row: " + std::string(dtype_name(t)) + " is not Q4_1, Q5_0, Q5_1 or IQ4_NL");
}

}  // namespace tessera::gguf_blocks
