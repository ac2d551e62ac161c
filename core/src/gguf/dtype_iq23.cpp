// Dequantization of the GGUF grid formats IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS and IQ3_S (layouts in
// block_formats.h, groups read by tessera/iq_grids.h): per group of 8, db = d·factor·(2l+1) in
// float, then db·magnitude·sign, the order ggml's dequantizer multiplies in (same bits).
#include <string>

#include "block_formats.h"
#include "tessera/error.h"
#include "tessera/iq_grids.h"

namespace tessera::gguf_blocks {

void dequantize_iq23_row(DType t, const uint8_t* src, float* dst, int64_t n) {
  if (t != DType::IQ2_XXS && t != DType::IQ2_XS && t != DType::IQ2_S && t != DType::IQ3_XXS && t != DType::IQ3_S) {
    throw Error("dequantize_iq23_row: " + std::string(dtype_name(t)) + " is not an IQ2/IQ3 grid format");
  }
  const size_t bytes = dtype_block_bytes(t);
  const float factor = iq_scale_factor(t);
  for (int64_t b = 0; b < n / 256; ++b, src += bytes, dst += 256) {
    const float d = load_fp16(src) * factor;
    for (int g = 0; g < 32; ++g) {
      const IqGroup q = iq_group(t, src, g);
      const float db = d * float(q.scale);
      for (int i = 0; i < 8; ++i) {
        const float v = db * float((q.mags >> (8 * i)) & 255);
        dst[8 * g + i] = (q.signs >> i) & 1 ? -v : v;
      }
    }
  }
}

}  // namespace tessera::gguf_blocks
