// IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS and IQ3_S from floats, by the method of ggml's reference quantizer
// (quantize_row_iq2_xxs_impl and its siblings) without an importance matrix. Per sub-block of 32
// (16 for IQ2_XS/IQ2_S): signs come off first (for the 7-bit sign formats an odd count of minus
// signs flips the least weighted element), then for scales around max/(2·levels - 1) each element
// takes the nearest odd level 2L + 1; an entry (8 or 4 elements) not in the codebook takes the best of
// its precomputed nearest codebook entries (the neighbours at the `shells` smallest lattice distances)
// under the weights, and the least-squares scale of the best try wins; entries found off the codebook
// are re-projected at that scale. The super-block scale d is the largest sub-scale / 31 (times ggml's
// fudge factor), and each sub-block keeps the 4-bit l nearest scale = d·(2l + 1).
// Weights: IQ3_XXS and IQ3_S x², IQ2_S x² + σ²/4, what ggml uses without an importance matrix.
// ggml refuses IQ2_XXS and IQ2_XS without one; they take IQ2_S's x² + σ²/4 here (relative RMS error
// on Gaussian rows 0.36 and 0.32, against 0.43 and 0.38 with x²).
#include <algorithm>
#include <cmath>
#include <mutex>
#include <string>
#include <vector>

#include "block_formats.h"
#include "tessera/error.h"
#include "tessera/iq_grids.h"

namespace tessera::gguf_blocks {

namespace {

struct Spec {
  DType t;
  int width;       // elements per codebook entry: 8 (IQ2) or 4 (IQ3)
  int levels;      // odd levels 1, 3, ..., 2·levels - 1
  int sub;         // elements per 4-bit scale
  bool parity;     // signs stored as 7 bits with an even count of minus signs
  int tries;       // scale tries each side
  float step;      // of 2·levels - 1 per try
  float fudge;     // stored d = fudge · largest sub-scale / 31 (ggml's factors)
  int shells;      // neighbour distances kept for off-codebook points
  float sigma_w;   // weights x² + sigma_w·σ², σ² = 2·Σx²/256
  int entries;     // codebook size
};

const Spec kSpecs[] = {
    {DType::IQ2_XXS, 8, 3, 32, true, 6, 0.1f, 1.0f, 2, 0.25f, 256},
    {DType::IQ2_XS, 8, 3, 16, true, 9, 0.1f, 1.0f, 2, 0.25f, 512},
    {DType::IQ2_S, 8, 3, 16, false, 9, 0.1f, 0.9875f, 1, 0.25f, 1024},
    {DType::IQ3_XXS, 4, 8, 32, true, 15, 0.2f, 1.0125f, 2, 0.0f, 256},
    {DType::IQ3_S, 4, 8, 32, false, 9, 0.2f, 1.033f, 3, 0.0f, 512},
};

const Spec& spec_of(DType t) {
  for (const Spec& s : kSpecs) {
    if (s.t == t) return s;
  }
  throw Error("quantize_iq23_row: " + std::string(dtype_name(t)) + " is not an IQ2/IQ3 grid format");
}

// The codebook as lattice points: entry e's levels L (0..levels-1), a map from a point's key (L_i in
// `bits` bits each) to its entry (>= 0) or to -(1 + offset) of its neighbour list (count, entries...).
struct Lattice {
  int bits = 0;
  std::vector<uint8_t> level;  // [entries][width]
  std::vector<int32_t> map;
  std::vector<uint16_t> neighbours;
};

uint64_t entry_mags(const Spec& s, int e) {
  switch (s.t) {
    case DType::IQ2_XXS: return kIq2XxsGrid[e];
    case DType::IQ2_XS: return kIq2XsGrid[e];
    case DType::IQ2_S: return kIq2SGrid[e];
    case DType::IQ3_XXS: return kIq3XxsGrid[e];
    default: return kIq3SGrid[e];
  }
}

Lattice build_lattice(const Spec& s) {
  Lattice lat;
  lat.bits = s.width == 8 ? 2 : 3;
  // The codebook's magnitudes, in order, are the levels (IQ2: 8 25 43; IQ3_XXS: 4 ... 62; IQ3_S: 1 ... 15).
  std::vector<int> values;
  for (int e = 0; e < s.entries; ++e) {
    for (int i = 0; i < s.width; ++i) values.push_back(int((entry_mags(s, e) >> (8 * i)) & 255));
  }
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());
  if (int(values.size()) != s.levels) throw Error("iq codebook: unexpected level count");
  lat.level.resize(size_t(s.entries * s.width));
  lat.map.assign(size_t(1) << (lat.bits * s.width), 0);
  std::fill(lat.map.begin(), lat.map.end(), -1 - (1 << 30));  // marks "not yet placed"
  for (int e = 0; e < s.entries; ++e) {
    int key = 0;
    for (int i = 0; i < s.width; ++i) {
      const int v = int((entry_mags(s, e) >> (8 * i)) & 255);
      const int l = int(std::lower_bound(values.begin(), values.end(), v) - values.begin());
      lat.level[size_t(e * s.width + i)] = uint8_t(l);
      key |= l << (lat.bits * i);
    }
    lat.map[size_t(key)] = e;
  }
  std::vector<int> dist(size_t(s.entries));
  for (int key = 0; key < int(lat.map.size()); ++key) {
    if (lat.map[size_t(key)] >= 0) continue;
    int pos[8];
    bool valid = true;
    for (int i = 0; i < s.width; ++i) {
      const int l = (key >> (lat.bits * i)) & ((1 << lat.bits) - 1);
      valid = valid && l < s.levels;
      pos[i] = 2 * l + 1;
    }
    if (!valid) continue;  // projection clamps levels, so such keys never occur
    for (int e = 0; e < s.entries; ++e) {
      int d2 = 0;
      for (int i = 0; i < s.width; ++i) {
        const int diff = 2 * lat.level[size_t(e * s.width + i)] + 1 - pos[i];
        d2 += diff * diff;
      }
      dist[size_t(e)] = d2;
    }
    // The entries at the `shells` smallest distances, nearest shell first (a linear pass per shell
    // instead of sorting the codebook for each of the thousands of points).
    lat.map[size_t(key)] = -1 - int(lat.neighbours.size());
    const size_t at = lat.neighbours.size();
    lat.neighbours.push_back(0);
    int below = -1;
    for (int shell = 0; shell < s.shells; ++shell) {
      int next = 1 << 30;
      for (int d2 : dist) {
        if (d2 > below) next = std::min(next, d2);
      }
      if (next == 1 << 30) break;
      for (int e = 0; e < s.entries; ++e) {
        if (dist[size_t(e)] == next) lat.neighbours.push_back(uint16_t(e));
      }
      below = next;
    }
    lat.neighbours[at] = uint16_t(lat.neighbours.size() - at - 1);
  }
  return lat;
}

const Lattice& lattice(const Spec& s) {
  static Lattice lats[std::size(kSpecs)];
  static std::once_flag once[std::size(kSpecs)];
  const size_t i = size_t(&s - kSpecs);
  std::call_once(once[i], [&] { lats[i] = build_lattice(s); });
  return lats[i];
}

int nearest_int(float v) { return int(std::nearbyint(v)); }

// Projects `width` magnitudes at inverse scale id onto the codebook; writes the entry's levels to L
// and returns the entry (and whether the nearest lattice point was in the codebook).
int project(const Spec& s, const Lattice& lat, const float* xval, const float* waux, float id, uint8_t* L,
            bool& on_grid) {
  int key = 0;
  for (int i = 0; i < s.width; ++i) {
    const int l = std::clamp(nearest_int(0.5f * (id * xval[i] - 1)), 0, s.levels - 1);
    L[i] = uint8_t(l);
    key |= l << (lat.bits * i);
  }
  const int m = lat.map[size_t(key)];
  on_grid = m >= 0;
  if (on_grid) return m;
  const uint16_t* nb = lat.neighbours.data() + (-m - 1);
  const float scale = 1 / id;
  float best = INFINITY;
  int entry = nb[1];
  for (int j = 1; j <= nb[0]; ++j) {
    float d2 = 0;
    for (int i = 0; i < s.width; ++i) {
      const float diff = scale * float(2 * lat.level[size_t(nb[j] * s.width + i)] + 1) - xval[i];
      d2 += waux[i] * diff * diff;
    }
    if (d2 < best) {
      best = d2;
      entry = nb[j];
    }
  }
  for (int i = 0; i < s.width; ++i) L[i] = lat.level[size_t(entry * s.width + i)];
  return entry;
}

// One sub-block of n elements: entries, sign bytes (one per 8) and the scale (0 for a zero block).
float quantize_sub(const Spec& s, const Lattice& lat, const float* x, int n, float sigma2, int* entries,
                   uint8_t* signs) {
  float w[32], waux[32], xval[32];
  uint8_t L[32], Laux[32];
  int ent_aux[8];
  bool on[8], on_aux[8];
  for (int i = 0; i < n; ++i) {
    w[i] = x[i] * x[i] + s.sigma_w * sigma2;
    waux[i] = std::sqrt(w[i]);
  }
  for (int k = 0; k < n / 8; ++k) {
    uint8_t bits = 0;
    int flips = 0;
    for (int i = 0; i < 8; ++i) {
      xval[8 * k + i] = std::fabs(x[8 * k + i]);
      if (x[8 * k + i] < 0) {
        bits |= uint8_t(1 << i);
        ++flips;
      }
    }
    if (s.parity && flips % 2) {  // the element that costs least keeps a wrong sign
      int imin = 0;
      for (int i = 1; i < 8; ++i) {
        if (w[8 * k + i] * x[8 * k + i] * x[8 * k + i] < w[8 * k + imin] * x[8 * k + imin] * x[8 * k + imin]) imin = i;
      }
      xval[8 * k + imin] = -xval[8 * k + imin];
      bits ^= uint8_t(1 << imin);
    }
    signs[k] = bits;
  }
  const int groups = n / s.width;
  for (int k = 0; k < groups; ++k) entries[k] = 0;
  const float max = *std::max_element(xval, xval + n);
  if (!(max >= 1e-8f)) return 0.0f;
  const float top = float(2 * s.levels - 1);
  float scale = max / top, best = 0;
  std::fill(on, on + groups, true);
  std::fill(L, L + n, uint8_t(0));
  for (int t = -s.tries; t <= s.tries; ++t) {
    const float id = (top + float(t) * s.step) / max;
    for (int k = 0; k < groups; ++k) {
      ent_aux[k] = project(s, lat, xval + s.width * k, waux + s.width * k, id, Laux + s.width * k, on_aux[k]);
    }
    float sumqx = 0, sumq2 = 0;
    for (int i = 0; i < n; ++i) {
      const float q = float(2 * Laux[i] + 1);
      sumqx += w[i] * xval[i] * q;
      sumq2 += w[i] * q * q;
    }
    if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
      scale = sumqx / sumq2;
      best = scale * sumqx;
      std::copy(Laux, Laux + n, L);
      std::copy(ent_aux, ent_aux + groups, entries);
      std::copy(on_aux, on_aux + groups, on);
    }
  }
  if (scale > 0 && std::find(on, on + groups, false) != on + groups) {
    for (int k = 0; k < groups; ++k) {
      if (!on[k]) entries[k] = project(s, lat, xval + s.width * k, waux + s.width * k, 1 / scale, L + s.width * k, on[k]);
    }
    float sumqx = 0, sumq2 = 0;
    for (int i = 0; i < n; ++i) {
      const float q = float(2 * L[i] + 1);
      sumqx += w[i] * xval[i] * q;
      sumq2 += w[i] * q * q;
    }
    if (sumq2 > 0) scale = sumqx / sumq2;
  }
  if (scale < 0) {  // the flipped element outweighs the rest: flip every sign instead
    scale = -scale;
    for (int k = 0; k < n / 8; ++k) signs[k] = uint8_t(~signs[k]);
  }
  return scale;
}

void store_u32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }

void quantize_block(const Spec& s, const Lattice& lat, const float* x, uint8_t* out) {
  const size_t bytes = dtype_block_bytes(s.t);
  std::fill(out, out + bytes, uint8_t(0));
  float sumx2 = 0;
  for (int i = 0; i < 256; ++i) sumx2 += x[i] * x[i];
  const float sigma2 = 2 * sumx2 / 256;
  const int subs = 256 / s.sub;
  float scales[16];
  int entries[16][8];
  uint8_t signs[16][4];
  float max_scale = 0;
  for (int b = 0; b < subs; ++b) {
    scales[b] = quantize_sub(s, lat, x + s.sub * b, s.sub, sigma2, entries[b], signs[b]);
    max_scale = std::max(max_scale, scales[b]);
  }
  if (!(max_scale > 0)) return;  // d = 0: every element decodes to 0
  const float d = max_scale / 31;
  store_fp16(out, d * s.fudge);
  int l[16];
  for (int b = 0; b < subs; ++b) l[b] = std::clamp(nearest_int(0.5f * (scales[b] / d - 1)), 0, 15);
  // Per group g of 8 (0..31): its sign byte, and its sub-block's entries.
  for (int g = 0; g < 32; ++g) {
    const int b = 8 * g / s.sub, k8 = g % (s.sub / 8);  // sub-block, group within it
    const uint8_t sg = signs[b][k8];
    const int ib = g / 4, j = g % 4;  // block of 32, group within it
    switch (s.t) {
      case DType::IQ2_XXS: {
        out[2 + 8 * ib + j] = uint8_t(entries[b][k8]);
        uint32_t v;
        std::memcpy(&v, out + 6 + 8 * ib, 4);
        store_u32(out + 6 + 8 * ib, v | uint32_t(sg & 127) << (7 * j) | (j == 0 ? uint32_t(l[b]) << 28 : 0));
        break;
      }
      case DType::IQ2_XS: {
        const uint16_t q = uint16_t(entries[b][k8] | (sg & 127) << 9);
        std::memcpy(out + 2 + 2 * g, &q, 2);
        if (k8 == 0) out[66 + ib] |= uint8_t(l[b] << (4 * (b % 2)));
        break;
      }
      case DType::IQ2_S:
        out[2 + g] = uint8_t(entries[b][k8] & 255);
        out[66 + ib] |= uint8_t((entries[b][k8] >> 8) << (2 * j));
        out[34 + g] = sg;
        if (k8 == 0) out[74 + ib] |= uint8_t(l[b] << (4 * (b % 2)));
        break;
      case DType::IQ3_XXS: {
        out[2 + 8 * ib + 2 * j] = uint8_t(entries[b][2 * k8]);
        out[2 + 8 * ib + 2 * j + 1] = uint8_t(entries[b][2 * k8 + 1]);
        uint32_t v;
        std::memcpy(&v, out + 66 + 4 * ib, 4);
        store_u32(out + 66 + 4 * ib, v | uint32_t(sg & 127) << (7 * j) | (j == 0 ? uint32_t(l[b]) << 28 : 0));
        break;
      }
      default:  // IQ3_S
        for (int h = 0; h < 2; ++h) {
          const int e = entries[b][2 * k8 + h];
          out[2 + 8 * ib + 2 * j + h] = uint8_t(e & 255);
          out[66 + ib] |= uint8_t((e >> 8) << (2 * j + h));
        }
        out[74 + g] = sg;
        if (j == 0) out[106 + ib / 2] |= uint8_t(l[b] << (4 * (ib % 2)));
        break;
    }
  }
}

}  // namespace

void quantize_iq23_row(DType t, const float* src, uint8_t* dst, int64_t n) {
  const Spec& s = spec_of(t);
  const Lattice& lat = lattice(s);
  for (int64_t b = 0; b < n / 256; ++b) quantize_block(s, lat, src + 256 * b, dst + size_t(b) * dtype_block_bytes(t));
}

}  // namespace tessera::gguf_blocks
