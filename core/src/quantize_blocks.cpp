#include "tessera/quantize_blocks.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "gguf/block_formats.h"
#include "tessera/error.h"

namespace tessera {

namespace {

void store_u16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }

// roundf (halves away from zero) for |v| < 2^31 without the libm call, which dominated Q8_0.
int round_half_away(float v) {
  int t = static_cast<int>(v);  // toward zero; v - t is exact
  const float frac = v - static_cast<float>(t);
  if (frac >= 0.5f) ++t;
  else if (frac <= -0.5f) --t;
  return t;
}

// Block of 32: d = amax / 127, q = round(x / d). Like ggml, the quants use 1/d in f32 and only the
// stored scale is rounded to fp16.
void quantize_q8_0(const float* x, uint8_t* out, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b, x += 32, out += 34) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_u16(out, f32_to_fp16(d));
    auto* q = reinterpret_cast<int8_t*>(out + 2);
    for (int i = 0; i < 32; ++i) q[i] = static_cast<int8_t>(round_half_away(x[i] * id));
  }
}

// Block of 32: d = m / -8 where m is the element of largest magnitude (with its sign), so m maps
// exactly to quant 0 and the opposite side gets the extra level; q = floor(x/d + 8.5) clamped to
// 15. Element i goes in the low nibble of byte i, element i + 16 in its high nibble.
void quantize_q4_0(const float* x, uint8_t* out, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b, x += 32, out += 18) {
    float amax = 0.0f, m = 0.0f;
    for (int i = 0; i < 32; ++i) {
      if (std::fabs(x[i]) > amax) {
        amax = std::fabs(x[i]);
        m = x[i];
      }
    }
    const float d = m / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_u16(out, f32_to_fp16(d));
    uint8_t* q = out + 2;
    auto level = [id](float v) {
      // x*id >= -8 (up to rounding), so the truncation below is a floor.
      const int l = static_cast<int>(v * id + 8.5f);
      return static_cast<uint8_t>(std::clamp(l, 0, 15));
    };
    for (int i = 0; i < 16; ++i) q[i] = static_cast<uint8_t>(level(x[i]) | (level(x[i + 16]) << 4));
  }
}

}  // namespace

bool quantize_supported(DType t) {
  switch (t) {
    case DType::F32:
    case DType::F16:
    case DType::BF16:
    case DType::Q8_0:
    case DType::Q4_0:
    case DType::Q4_K:
    case DType::Q6_K:
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::Q5_K:
    case DType::IQ4_NL:
    case DType::IQ4_XS:
    case DType::IQ2_XXS:
    case DType::IQ2_XS:
    case DType::IQ2_S:
    case DType::IQ3_XXS:
    case DType::IQ3_S: return true;
    default: return false;
  }
}

void quantize_row(DType t, const float* src, void* dst, int64_t n) {
  if (!quantize_supported(t)) {
    throw Error("cannot quantize f32 to " + std::string(dtype_name(t)) +
                " (supported: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl, "
                "iq4_xs, iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s)");
  }
  dtype_row_bytes(t, n);  // validates n against the block size
  auto* out = static_cast<uint8_t*>(dst);
  switch (t) {
    case DType::F32: std::memcpy(dst, src, static_cast<size_t>(n) * 4); return;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) store_u16(out + 2 * i, f32_to_fp16(src[i]));
      return;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) store_u16(out + 2 * i, f32_to_bf16(src[i]));
      return;
    case DType::Q8_0: quantize_q8_0(src, out, n); return;
    case DType::Q4_0: quantize_q4_0(src, out, n); return;
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1: gguf_blocks::quantize_legacy_row(t, src, out, n); return;
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K: gguf_blocks::quantize_kquant_row(t, src, out, n); return;
    case DType::IQ4_NL:
    case DType::IQ4_XS: gguf_blocks::quantize_iq4_row(t, src, out, n); return;
    case DType::IQ2_XXS:
    case DType::IQ2_XS:
    case DType::IQ2_S:
    case DType::IQ3_XXS:
    case DType::IQ3_S: gguf_blocks::quantize_iq23_row(t, src, out, n); return;
    default: return;
  }
}

}  // namespace tessera
