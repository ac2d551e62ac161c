// Building blocks for quantizer plugins: a Linear that is one weight on the backend run by
// backend.gemm, and the float path every quantizer offers for tensors it keeps in float.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "tessera/device_buffer.h"
#include "tessera/quantizer.h"

namespace tessera {

// y = x·Wᵀ through backend.gemm on `view`. `data` holds the weight; `extra` optional side data
// (e.g. scales) that `view` points into.
class BackendLinear final : public Linear {
 public:
  BackendLinear(Backend& backend, DeviceBuffer data, WeightView view, std::string format, DeviceBuffer extra = {});
  void forward(const float* x, int64_t m, float* y) override;
  bool forward_parts(const float* x, int64_t m, std::span<const OutputPart> parts) override {
    return backend_.gemm_parts(x, m, view_, parts.data(), parts.size());
  }
  int64_t in_features() const override { return view_.cols; }
  int64_t out_features() const override { return view_.rows; }
  size_t resident_bytes() const override { return data_.size() + extra_.size(); }
  std::string format() const override { return format_; }
  WeightView view() const override { return view_; }
  bool runs_as_gemm() const override { return true; }

 private:
  Backend& backend_;
  DeviceBuffer data_;
  DeviceBuffer extra_;
  WeightView view_;
  std::string format_;
};

// `w` on the backend in floating point: `target` F32/F16/BF16, or (nullopt) float types as stored
// and GGUF blocks expanded to f32. Converted row by row, never a whole host copy. format() is the
// type name, with `note` in parentheses when given. Throws Error naming `who`, the tensor and the
// backend when the backend has no gemm for the type.
std::unique_ptr<Linear> make_float_linear(Backend& backend, const WeightSource& w, std::optional<DType> target,
                                          const std::string& who, const std::string& note = "");

// `w` as W8A8 int8 on the backend: symmetric int8 per output channel (scale = absmax/127, halves
// rounded away from zero), `cpu_variant` the CPU backend's kernel (cpu_int_kernel.h; other
// backends take 0). Quantized and uploaded a few MiB of rows at a time, never a whole host copy.
// A variant the backend refuses, a backend without i8 gemm or a non-finite weight throws Error
// naming `who` and the tensor. format() is "int8".
std::unique_ptr<Linear> make_int8_linear(Backend& backend, const WeightSource& w, int32_t cpu_variant,
                                         const std::string& who);

}  // namespace tessera
