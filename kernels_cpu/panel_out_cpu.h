// Where a panel GEMM's output columns go: one dense y[m][n], or runs of whole panels dealt out to
// parts (Backend::gemm_parts), each a dense matrix of its own. The f32 and int8 panel kernels both
// hold 16 rows of W a panel. Compiled as C++17 (kernel sources).
#pragma once

#include <cstddef>
#include <cstdint>

#include "tessera/tensor.h"

namespace tessera::cpu {

class PanelOut {
 public:
  static constexpr int64_t kPanelColumns = 16;

  PanelOut(float* y, int64_t n) : y_(y), ld_(n) {}
  PanelOut(const OutputPart* parts, size_t n_parts) : parts_(parts), n_parts_(n_parts) {}

  // Whether `parts` take whole panels and all n columns between them (what gemm_parts needs).
  static bool splits(int64_t n, const OutputPart* parts, size_t n_parts) {
    int64_t cols = 0;
    for (size_t i = 0; i < n_parts; ++i) {
      if (parts[i].cols <= 0 || parts[i].cols % kPanelColumns != 0) return false;
      cols += parts[i].cols;
    }
    return cols == n;
  }

  // The dense y, or null when the columns go to parts.
  float* dense() const { return y_; }

  // Row 0 of the columns of panels [q, q + count), which lie in one part with rows `ld` apart;
  // null where they span two parts.
  float* columns(int64_t q, int64_t count, int64_t& ld) const {
    if (parts_ == nullptr) {
      ld = ld_;
      return y_ + q * kPanelColumns;
    }
    int64_t start = 0;
    for (size_t i = 0; i < n_parts_; ++i) {
      const OutputPart& part = parts_[i];
      if (q * kPanelColumns < start + part.cols) {
        ld = part.cols;
        return (q + count) * kPanelColumns <= start + part.cols ? part.data + (q * kPanelColumns - start) : nullptr;
      }
      start += part.cols;
    }
    return nullptr;
  }

 private:
  const OutputPart* parts_ = nullptr;
  size_t n_parts_ = 0;
  float* y_ = nullptr;
  int64_t ld_ = 0;
};

}  // namespace tessera::cpu
