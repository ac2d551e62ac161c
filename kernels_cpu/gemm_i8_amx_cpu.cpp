// The int8 GEMM's prefill (m > 1) on Intel AMX: tdpbssd multiplies a tile of 16 rows x 64 bytes of
// quantized x by a tile of 64 columns x 16 rows of W, summing into 16 x 16 int32 lanes, exact.
//
// No copy of the weights: a panel of the int8 layout (gemm_i8_panels_cpu.cpp) stores, per quad of
// columns, its 16 rows' four bytes side by side, which is the row layout of AMX's B tile (each
// 64-byte row: 16 output columns x 4 consecutive k). A panel's columns [64c, 64c + 64) are so one
// B tile, 16 rows of 64 bytes one after another. x's rows load as A tiles straight from the
// quantized rows (stride k); a partial last block of rows is first copied into zero rows.
// The same exact int32 dots as the AVX2 and VNNI tiles, scaled by the same epilogue: the same bits.
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels_cpu.h"

namespace tessera::cpu {

namespace {

constexpr int64_t kPanel = 16;
constexpr int64_t kTileK = 64;  // bytes of k in one A tile row, 16 quads of a panel in one B tile

// Tiles 0-3 hold C[row block r][panel p] at 2r + p, 4-5 A (two row blocks), 6-7 B (two panels).
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

__attribute__((target("amx-tile"))) void load_config() {
  TileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.rows[t] = 16;
    c.colsb[t] = 64;
  }
  _tile_loadconfig(&c);
}

// C (16 x 16 int32 in a tile) to y's 16 x 16 block, as gemm_i8_panels's epilogue: float(acc) ·
// (sx · scale), rows from i0 below m only.
void store_block(const int32_t* acc, const float* sx, const float* scales, int64_t i0, int64_t m, int64_t n,
                 int64_t j, float* y) {
  for (int64_t r = 0; r < kPanel && i0 + r < m; ++r) {
    const int64_t i = i0 + r;
    for (int64_t c = 0; c < kPanel; ++c) y[i * n + j + c] = float(acc[r * kPanel + c]) * (sx[i] * scales[j + c]);
  }
}

}  // namespace

bool amx_int8_usable() {
  static const bool value = [] {
    if (isa_cap() != IsaCap::none || !has_avx512_vnni()) return false;
    // CPUID.(7,0):EDX bits 24 (AMX-TILE) and 25 (AMX-INT8), read directly: clang before 16 has no
    // "amx-*" for __builtin_cpu_supports.
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || (d & (3u << 24)) != (3u << 24)) return false;
    // Linux hands out the tile registers' state only on request (ARCH_REQ_XCOMP_PERM for
    // XFEATURE_XTILEDATA), once for the process; where it refuses, AMX is not used.
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return value;
}

__attribute__((target("amx-tile,amx-int8"))) void gemm_i8_amx(const int8_t* xq, const float* sx, int64_t m,
                                                              const WeightView& w, int64_t q0, int64_t q1, float* y) {
  const int64_t k = w.cols;
  const int64_t n = w.rows;
  const int64_t kt = k / kTileK;
  const auto* panels = static_cast<const int8_t*>(w.data);
  // x in blocks of 16 rows; a partial last block is copied under zero rows, so A tiles never read
  // past x.
  const int64_t whole = m / kPanel * kPanel;
  thread_local std::vector<int8_t> tail;
  if (whole < m) {
    tail.assign(size_t(kPanel * k), 0);
    std::memcpy(tail.data(), xq + whole * k, size_t((m - whole) * k));
  }
  auto rows_at = [&](int64_t i0) { return i0 < whole ? xq + i0 * k : tail.data(); };
  load_config();
  alignas(64) int32_t acc[kPanel * kPanel];
  for (int64_t q = q0; q < q1; q += 2) {
    const bool two_panels = q + 1 < q1;
    const int8_t* b0 = panels + q * kPanel * k;
    const int8_t* b1 = b0 + kPanel * k;
    for (int64_t i0 = 0; i0 < m; i0 += 2 * kPanel) {
      const bool two_blocks = i0 + kPanel < m;
      const int8_t* a0 = rows_at(i0);
      const int8_t* a1 = two_blocks ? rows_at(i0 + kPanel) : a0;
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t t = 0; t < kt; ++t) {
        _tile_loadd(4, a0 + t * kTileK, k);
        _tile_loadd(6, b0 + t * kTileK * kPanel, kTileK);
        _tile_dpbssd(0, 4, 6);
        if (two_panels) {
          _tile_loadd(7, b1 + t * kTileK * kPanel, kTileK);
          _tile_dpbssd(1, 4, 7);
        }
        if (two_blocks) {
          _tile_loadd(5, a1 + t * kTileK, k);
          _tile_dpbssd(2, 5, 6);
          if (two_panels) _tile_dpbssd(3, 5, 7);
        }
      }
      for (int r = 0; r < (two_blocks ? 2 : 1); ++r) {
        for (int p = 0; p < (two_panels ? 2 : 1); ++p) {
          // The tile index of _tile_stored must be a constant.
          switch (2 * r + p) {
            case 0: _tile_stored(0, acc, kPanel * 4); break;
            case 1: _tile_stored(1, acc, kPanel * 4); break;
            case 2: _tile_stored(2, acc, kPanel * 4); break;
            default: _tile_stored(3, acc, kPanel * 4); break;
          }
          store_block(acc, sx, w.scales, i0 + r * kPanel, m, n, (q + p) * kPanel, y);
        }
      }
    }
  }
  _tile_release();
}

}  // namespace tessera::cpu
