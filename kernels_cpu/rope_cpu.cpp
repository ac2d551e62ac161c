#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "kernels_cpu.h"

namespace tessera::cpu {

namespace {

// cos/sin of every (position, frequency) pair seen so far, for one set of pair frequencies (and
// magnitude): the model rotates q and k of every layer at the same positions, so each angle is
// computed once (in double) instead of per call. A few tables per calling thread, so that models
// whose layers alternate two bases (Gemma 3's local and global layers) keep both; grown before the
// parallel loop.
struct AngleTable {
  float theta = 0;               // the base its frequencies come from; 0: frequencies given (rope_freqs)
  float mscale = 1.0f;
  std::vector<double> inv_freq;  // [rope_dim / 2]
  int64_t positions = 0;
  std::vector<float> cos, sin;  // [position][rope_dim / 2]

  void cover(int64_t max_pos) {
    if (max_pos < positions) return;
    const auto half = int64_t(inv_freq.size());
    const int64_t grown = std::max(max_pos + 1, 2 * positions);
    cos.resize(size_t(grown * half));
    sin.resize(size_t(grown * half));
    for (int64_t i = 0; i < half; ++i) {
      for (int64_t p = positions; p < grown; ++p) {
        const double a = double(p) * inv_freq[size_t(i)];
        cos[size_t(p * half + i)] = static_cast<float>(std::cos(a)) * mscale;
        sin[size_t(p * half + i)] = static_cast<float>(std::sin(a)) * mscale;
      }
    }
    positions = grown;
  }
};

// The table of base `theta` (freqs null: pair i turns by theta^(-2i/rope_dim)) or of the given
// frequencies, covering positions up to max_pos.
AngleTable& table_for(float theta, int64_t rope_dim, const float* freqs, float mscale, int32_t max_pos) {
  thread_local std::array<AngleTable, 4> tables;
  thread_local size_t next = 0;
  const auto half = size_t(rope_dim / 2);
  auto same = [&](const AngleTable& c) {
    if (c.theta != theta || c.mscale != mscale || c.inv_freq.size() != half) return false;
    for (size_t i = 0; freqs != nullptr && i < half; ++i) {
      if (c.inv_freq[i] != double(freqs[i])) return false;
    }
    return true;
  };
  AngleTable* t = nullptr;
  for (AngleTable& c : tables) {
    if (same(c)) t = &c;
  }
  if (t == nullptr) {
    t = &tables[next++ % tables.size()];
    *t = AngleTable{theta, mscale, std::vector<double>(half), 0, {}, {}};
    for (size_t i = 0; i < half; ++i) {
      t->inv_freq[i] = freqs != nullptr ? double(freqs[i])
                                        : std::pow(double(theta), -2.0 * double(i) / double(rope_dim));
    }
  }
  t->cover(max_pos);
  return *t;
}

void rotate(float* x, const int32_t* positions, int64_t rows, int64_t n_heads, int64_t head_dim, const AngleTable& table,
            RopeStyle style) {
  const auto half = int64_t(table.inv_freq.size());
  const float* cos_all = table.cos.data();
  const float* sin_all = table.sin.data();
  for_rows(rows, rows * n_heads * head_dim > kParallelWork, [&](int64_t r) {
    const float* cos_v = cos_all + int64_t(positions[r]) * half;
    const float* sin_v = sin_all + int64_t(positions[r]) * half;
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + (r * n_heads + h) * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const int64_t i0 = style == RopeStyle::adjacent ? 2 * i : i;
        const int64_t i1 = style == RopeStyle::adjacent ? 2 * i + 1 : i + half;
        const float a = v[i0];
        const float b = v[i1];
        v[i0] = a * cos_v[i] - b * sin_v[i];
        v[i1] = a * sin_v[i] + b * cos_v[i];
      }
    }
  });
}

int32_t max_position(const int32_t* positions, int64_t rows) {
  int32_t max_pos = 0;
  for (int64_t r = 0; r < rows; ++r) max_pos = std::max(max_pos, positions[r]);
  return max_pos;
}

}  // namespace

void rope(float* x, const int32_t* positions, int64_t rows, int64_t n_heads, int64_t head_dim,
          int64_t rope_dim, float theta, RopeStyle style) {
  const AngleTable& table = table_for(theta, rope_dim, nullptr, 1.0f, max_position(positions, rows));
  rotate(x, positions, rows, n_heads, head_dim, table, style);
}

void rope_freqs(float* x, const int32_t* positions, int64_t rows, int64_t n_heads, int64_t head_dim,
                int64_t rope_dim, const float* inv_freq, float mscale, RopeStyle style) {
  const AngleTable& table = table_for(0.0f, rope_dim, inv_freq, mscale, max_position(positions, rows));
  rotate(x, positions, rows, n_heads, head_dim, table, style);
}

}  // namespace tessera::cpu
