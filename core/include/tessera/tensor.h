// Non-owning views of tensors in backend memory. Shapes are row-major, outermost first
// (a GGUF tensor with ne0=cols, ne1=rows is {rows, cols}).
#pragma once

#include <cstddef>
#include <cstdint>

#include "tessera/dtype.h"

namespace tessera {

// A 2-D weight matrix W[rows][cols] (rows = output features) as the backend stores it.
// Quantized formats may carry per-row or per-group scales beside the packed data:
//   I8 (W8A8): data int8 [rows][cols], scales float [rows] (symmetric, per output channel);
//              activations are quantized per token inside the kernel.
//   I4:        data packed two per byte, low nibble first, [rows][cols/2]; scales float
//              [rows][cols/group_size]; zeros (asymmetric) float [rows][cols/group_size] or null
//              (symmetric: value = (q - 8) * scale; asymmetric: value = (q - zero) * scale).
struct WeightView {
  const void* data = nullptr;
  DType dtype = DType::F32;
  int64_t rows = 0;
  int64_t cols = 0;
  const float* scales = nullptr;  // per-row/per-group scales for formats that keep them apart
  const float* zeros = nullptr;   // asymmetric formats: per-group zero points
  int64_t group_size = 0;         // elements per scale group; 0 = per row
  int32_t kernel_variant = 0;     // backend-specific implementation choice; 0 = the backend's default
};

// A run of `cols` output columns of a matrix product, written to its own dense [rows][cols]
// matrix at `data` (backend memory): a fused weight's output dealt out to its parts.
struct OutputPart {
  float* data = nullptr;
  int64_t cols = 0;
};

// A contiguous float activation matrix [rows][cols] in backend memory.
struct MatrixView {
  float* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
};

}  // namespace tessera
