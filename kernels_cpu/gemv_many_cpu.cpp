// Backend::gemv_many: one token through several weights that share x in one parallel region. A
// decode step's q|k and v, stored in two formats (int4 with v in int8, int8 with v kept in float),
// took two regions; each region pays a fork, a join and both threads' streams starting cold, which
// on a VM whose vCPUs sit on two CCDs (a cache line's round trip ~300 ns) costs several
// microseconds a GEMV. Here every thread takes its slice of each weight, cut at whole bands or
// panels, and runs the weight's own kernel on it alone (a region inside a region runs on its
// caller): each row is computed as its gemm computes it, so the bits are the same. gemv_share is
// one thread's part, for a caller that runs a whole layer in one region (core/src/model_decode.cpp).
#include <algorithm>

#include "gemm_blocks_cpu.h"
#include "kernels_cpu.h"
#include "panel_out_cpu.h"
#include "tessera/thread_team.h"

namespace tessera::cpu {

namespace {

// Rows a slice of `w` may start at a multiple of (the kernel's band or panel), 0 where slices are
// not supported.
int64_t slice_rows(const WeightView& w) {
  switch (w.dtype) {
    case DType::I4:
      return w.group_size > 0 ? 8 : 0;  // bands of 8 rows
    case DType::I8:  // our panels (oneDNN's variant keeps its own state per shape)
      return (w.kernel_variant & kI8PackedPanels) != 0 ? PanelOut::kPanelColumns : 0;
    case DType::F32:
      return PanelOut::kPanelColumns;  // panels of 16 rows, row-major rows after them
    case DType::Q8_0:  // the file's blocks in bands of 8 rows, then a tile of 4 and rows
    case DType::Q4_0:
      return (w.kernel_variant & kBlockBandsPacked) != 0 ? kRowsPerBand : 0;
    default:
      return 0;
  }
}

WeightView rows_of(const WeightView& w, int64_t r0, int64_t r1) {
  if (w.dtype == DType::I4) return i4_rows(w, r0, r1);
  WeightView part = w;
  part.rows = r1 - r0;
  part.data = static_cast<const char*>(w.data) + r0 * int64_t(dtype_row_bytes(w.dtype, w.cols));
  if (w.dtype == DType::I8) part.scales = w.scales + r0;  // a scale per row
  return part;
}

}  // namespace

bool gemv_shares(const WeightView* views, size_t n) {
  size_t bytes = 0;
  for (size_t i = 0; i < n; ++i) {
    if (slice_rows(views[i]) == 0) return false;
    bytes += size_t(views[i].rows) * dtype_row_bytes(views[i].dtype, views[i].cols);
  }
  return bytes >= size_t(kParallelStreamBytes);  // else a gemm runs alone
}

void gemv_share(const float* x, const WeightView* views, float* const* ys, size_t n, int t, int nt) {
  for (size_t i = 0; i < n; ++i) {
    const WeightView& w = views[i];
    const int64_t unit = slice_rows(w);
    auto first_row = [&](int s) { return s >= nt ? w.rows : w.rows * s / nt / unit * unit; };
    const int64_t r0 = first_row(t), r1 = first_row(t + 1);
    if (r1 > r0) gemm(x, 1, rows_of(w, r0, r1), ys[i] + r0);
  }
}

bool gemv_many(const float* x, const WeightView* views, float* const* ys, size_t n) {
  if (n < 2 || team_max_threads() < 2 || !gemv_shares(views, n)) return false;
  team_run([&](int t, int nt) { gemv_share(x, views, ys, n, t, nt); });
  return true;
}

}  // namespace tessera::cpu
