// IQ4_NL and IQ4_XS from floats with ggml's scale search (quantize_row_iq4_nl_impl, as llama.cpp's
// quantizer calls it without an importance matrix: weights x², 7 tries each side): per block of 32,
// each element takes the nearest of the 16 table levels; the scale starts where the element of
// largest magnitude maps to the table's end (-127) and the best least-squares scale over nearby
// starting points wins. IQ4_XS then stores each block's scale in 6 signed bits against
// d = -largest/32 and re-picks the levels against the stored scale.
#include <algorithm>
#include <cmath>
#include <string>

#include "block_formats.h"
#include "tessera/error.h"

namespace tessera::gguf_blocks {

namespace {

constexpr int kTries = 7;

// The level nearest v, a tie going to the upper one (ggml's best_index_int8): level j is taken
// once 2v reaches t[j-1] + t[j], compared exactly (2v and the integer sums are exact in f32);
// a bisection over those 15 thresholds.
int nearest_level(float v) {
  const int8_t* t = kIq4NlValues;
  const float v2 = v + v;
  int idx = 0;
  for (int step = 8; step > 0; step >>= 1) {
    const int j = idx + step;
    if (v2 >= float(t[j - 1] + t[j])) idx = j;
  }
  return idx;
}

// The scale of one block of 32 (0 for an all-zero block).
float block_scale(const float* x) {
  float amax = 0, m = 0;
  for (int j = 0; j < 32; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      m = x[j];
    }
  }
  if (amax < 1e-15f) return 0.0f;
  auto fit = [x](float id, float& sumqx, float& sumq2) {
    sumqx = sumq2 = 0;
    for (int j = 0; j < 32; ++j) {
      const float q = kIq4NlValues[nearest_level(id * x[j])];
      const float w = x[j] * x[j];
      sumqx += w * q * x[j];
      sumq2 += w * q * q;
    }
  };
  float sumqx, sumq2;
  fit(1.0f / (-m / float(kIq4NlValues[0])), sumqx, sumq2);
  float d = sumq2 > 0 ? sumqx / sumq2 : 0.0f, best = d * sumqx;
  for (int t = -kTries; t <= kTries; ++t) {
    fit((float(t) + float(kIq4NlValues[0])) / m, sumqx, sumq2);
    if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
      d = sumqx / sumq2;
      best = d * sumqx;
    }
  }
  return d;
}

void pack_levels(const float* x, float d, uint8_t* qs) {
  const float id = d != 0 ? 1.0f / d : 0.0f;
  for (int j = 0; j < 16; ++j) {
    qs[j] = uint8_t(nearest_level(id * x[j]) | (nearest_level(id * x[j + 16]) << 4));
  }
}

void quantize_iq4_nl(const float* x, uint8_t* out, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += 32, out += 18) {
    const float d = block_scale(x);
    store_fp16(out, d);
    // The levels against the search's scale (in f32, as the reference), not the stored fp16 one;
    // an all-zero block picks the level nearest 0 throughout.
    pack_levels(x, d, out + 2);
  }
}

void quantize_iq4_xs(const float* x, uint8_t* out, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += 256, out += 136) {
    float scales[8], amax = 0, max_scale = 0;
    for (int j = 0; j < 8; ++j) {
      scales[j] = block_scale(x + 32 * j);
      if (std::fabs(scales[j]) > amax) {
        amax = std::fabs(scales[j]);
        max_scale = scales[j];
      }
    }
    const float d = -max_scale / 32;
    store_fp16(out, d);
    const float id = d != 0 ? 1.0f / d : 0.0f;
    uint16_t high = 0;
    std::fill(out + 4, out + 8, uint8_t(0));
    for (int j = 0; j < 8; ++j) {
      const int l = std::clamp(int(std::nearbyint(id * scales[j])), -32, 31);
      // The reference picks levels against d·l in f32 (an all-zero scale picks level 0 for all).
      pack_levels(x + 32 * j, d * float(l), out + 8 + 16 * j);
      const int stored = l + 32;
      out[4 + j / 2] |= uint8_t((stored & 0x0f) << (4 * (j % 2)));
      high |= uint16_t((stored >> 4) << (2 * j));
    }
    std::memcpy(out + 2, &high, 2);
  }
}

}  // namespace

void quantize_iq4_row(DType t, const float* src, uint8_t* dst, int64_t n) {
  switch (t) {
    case DType::IQ4_NL: return quantize_iq4_nl(src, dst, n / 32);
    case DType::IQ4_XS: return quantize_iq4_xs(src, dst, n / 256);
    default: break;
  }
  throw Error("quantize_iq4_row: " + std::string(dtype_name(t)) + " is not IQ4_NL or IQ4_XS");
}

}  // namespace tessera::gguf_blocks
