// Q4_1, Q5_0 and Q5_1 from floats as ggml's reference quantizers do (quantize_row_q4_1_ref and
// kin): a range fit per block of 32, quants truncated after adding one half (a floor, the values
// being non-negative), so the blocks match what llama.cpp writes for the same floats.
#include <algorithm>
#include <cmath>
#include <string>

#include "block_formats.h"
#include "tessera/error.h"

namespace tessera::gguf_blocks {

namespace {

// Q4_1 (nmax 15) and Q5_1 (nmax 31): d = (max - min) / nmax, m = min, q = floor((x - min)/d + ½).
template <int kMax>
void quantize_min(const float* x, uint8_t* out, int64_t nb) {
  constexpr bool kFifth = kMax == 31;
  constexpr size_t kBytes = kFifth ? 24 : 20;
  for (int64_t b = 0; b < nb; ++b, x += 32, out += kBytes) {
    float lo = x[0], hi = x[0];
    for (int i = 1; i < 32; ++i) {
      lo = std::min(lo, x[i]);
      hi = std::max(hi, x[i]);
    }
    const float d = (hi - lo) / float(kMax);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_fp16(out, d);
    store_fp16(out + 2, lo);
    uint32_t high = 0;
    uint8_t* qs = out + 4 + (kFifth ? 4 : 0);
    for (int i = 0; i < 16; ++i) {
      // Q4_1 clamps to 15; Q5_1 does not (the reference's own asymmetry; (x - min)/d cannot
      // reach 31.5, so it never matters).
      int q0 = int((x[i] - lo) * id + 0.5f), q1 = int((x[i + 16] - lo) * id + 0.5f);
      if (!kFifth) {
        q0 = std::min(kMax, q0);
        q1 = std::min(kMax, q1);
      }
      qs[i] = uint8_t((q0 & 0x0f) | ((q1 & 0x0f) << 4));
      high |= uint32_t((q0 >> 4) & 1) << i;
      high |= uint32_t((q1 >> 4) & 1) << (i + 16);
    }
    if (kFifth) std::memcpy(out + 4, &high, 4);
  }
}

// Q5_0: as Q4_0 with 32 levels: d = m / -16 (m the element of largest magnitude, with its sign),
// q = floor(x/d + 16.5) clamped to 31.
void quantize_q5_0(const float* x, uint8_t* out, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += 32, out += 22) {
    float amax = 0.0f, m = 0.0f;
    for (int i = 0; i < 32; ++i) {
      if (std::fabs(x[i]) > amax) {
        amax = std::fabs(x[i]);
        m = x[i];
      }
    }
    const float d = m / -16.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_fp16(out, d);
    auto level = [id](float v) { return std::clamp(int(v * id + 16.5f), 0, 31); };
    uint32_t high = 0;
    for (int i = 0; i < 16; ++i) {
      const int q0 = level(x[i]), q1 = level(x[i + 16]);
      out[6 + i] = uint8_t((q0 & 0x0f) | ((q1 & 0x0f) << 4));
      high |= uint32_t(q0 >> 4) << i;
      high |= uint32_t(q1 >> 4) << (i + 16);
    }
    std::memcpy(out + 2, &high, 4);
  }
}

}  // namespace

void quantize_legacy_row(DType t, const float* src, uint8_t* dst, int64_t n) {
  switch (t) {
    case DType::Q4_1: return quantize_min<15>(src, dst, n / 32);
    case DType::Q5_0: return quantize_q5_0(src, dst, n / 32);
    case DType::Q5_1: return quantize_min<31>(src, dst, n / 32);
    default: break;
  }
  throw Error("quantize_legacy_row: " + std::string(dtype_name(t)) + " is not Q4_1, Q5_0 or Q5_1");
}

}  // namespace tessera::gguf_blocks
