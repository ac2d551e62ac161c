// The codebooks of the GGUF IQ2/IQ3 formats (data in core/src/gguf/iq_grids.cpp, ggml's bit for bit).
// An IQ2 entry is 8 magnitudes (bytes, element 0 lowest; levels 8, 25, 43), an IQ3 entry 4
// (IQ3_XXS: 4..62, IQ3_S: the odd numbers 1..15). kIqSigns maps 7 stored sign bits to 8 with an even
// count of minus signs (IQ2_XXS, IQ2_XS, IQ3_XXS); IQ2_S and IQ3_S store all 8.
#pragma once

#include <cstdint>
#include <cstring>

#include "tessera/dtype.h"

namespace tessera {

extern const uint8_t kIqSigns[128];
extern const uint64_t kIq2XxsGrid[256];
extern const uint64_t kIq2XsGrid[512];
extern const uint64_t kIq2SGrid[1024];
extern const uint32_t kIq3XxsGrid[256];
extern const uint32_t kIq3SGrid[512];

// Group g (0..31) of 8 elements of one block: element i is
// d · iq_scale_factor(t) · scale · byte i of mags, negated where bit i of signs is set.
struct IqGroup {
  uint64_t mags;
  uint8_t signs;
  int32_t scale;  // 2l + 1 for the stored 4-bit l of the group's 16 or 32
};

// 1/8 (IQ2), 1/4 (IQ3_XXS), 1 (IQ3_S): a power of two, so d · factor is exact.
inline float iq_scale_factor(DType t) {
  return t == DType::IQ3_S ? 1.0f : t == DType::IQ3_XXS ? 0.25f : 0.125f;
}

inline IqGroup iq_group(DType t, const uint8_t* blk, int g) {
  auto u32 = [](const uint8_t* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
  };
  const int ib = g / 4, l = g % 4;
  switch (t) {
    case DType::IQ2_XXS: {
      const uint32_t idx = u32(blk + 2 + 8 * ib), sgn = u32(blk + 6 + 8 * ib);
      return {kIq2XxsGrid[(idx >> (8 * l)) & 255], kIqSigns[(sgn >> (7 * l)) & 127], int32_t(2 * (sgn >> 28) + 1)};
    }
    case DType::IQ2_XS: {
      uint16_t q;
      std::memcpy(&q, blk + 2 + 2 * g, 2);
      return {kIq2XsGrid[q & 511], kIqSigns[q >> 9], 2 * ((blk[66 + ib] >> (4 * (l / 2))) & 15) + 1};
    }
    case DType::IQ2_S: {
      const int idx = blk[2 + g] | (((blk[66 + ib] >> (2 * l)) & 3) << 8);
      return {kIq2SGrid[idx], blk[34 + g], 2 * ((blk[74 + ib] >> (4 * (l / 2))) & 15) + 1};
    }
    case DType::IQ3_XXS: {
      const uint8_t* qs = blk + 2 + 8 * ib + 2 * l;
      const uint32_t sgn = u32(blk + 66 + 4 * ib);
      return {kIq3XxsGrid[qs[0]] | uint64_t(kIq3XxsGrid[qs[1]]) << 32, kIqSigns[(sgn >> (7 * l)) & 127],
              int32_t(2 * (sgn >> 28) + 1)};
    }
    case DType::IQ3_S: {
      const uint8_t* qs = blk + 2 + 8 * ib + 2 * l;
      const int high = blk[66 + ib] >> (2 * l);
      return {kIq3SGrid[qs[0] | ((high & 1) << 8)] | uint64_t(kIq3SGrid[qs[1] | ((high & 2) << 7)]) << 32,
              blk[74 + g], 2 * ((blk[106 + ib / 2] >> (4 * (ib % 2))) & 15) + 1};
    }
    default: return {0, 0, 0};
  }
}

}  // namespace tessera
