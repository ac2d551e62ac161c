#include "tessera/backend_linear.h"

#include <cstring>
#include <vector>

#include "tessera/error.h"

namespace tessera {

BackendLinear::BackendLinear(Backend& backend, DeviceBuffer data, WeightView view, std::string format,
                             DeviceBuffer extra)
    : backend_(backend), data_(std::move(data)), extra_(std::move(extra)), view_(view), format_(std::move(format)) {
  backend_.prepare_weight(view_);
}

void BackendLinear::forward(const float* x, int64_t m, float* y) { backend_.gemm(x, m, view_, y); }

std::unique_ptr<Linear> make_float_linear(Backend& backend, const WeightSource& w, std::optional<DType> target_in,
                                          const std::string& who, const std::string& note) {
  const DType target = target_in ? *target_in : (dtype_is_float(w.dtype) ? w.dtype : DType::F32);
  if (!dtype_is_float(target)) {
    throw Error(who + ": " + std::string(dtype_name(target)) + " is not a floating-point type");
  }
  if (!backend.supports(Op::gemm, target)) {
    throw Error(who + " needs gemm on " + std::string(dtype_name(target)) + " on the " +
                std::string(backend.name()) + " backend (tensor " + w.name + ")");
  }
  const size_t in_row = dtype_row_bytes(w.dtype, w.cols);
  const size_t out_row = dtype_row_bytes(target, w.cols);
  DeviceBuffer buf(backend, out_row * size_t(w.rows));
  if (target == w.dtype) {
    buf.upload(w.data, buf.size());
  } else {
    std::vector<float> row(size_t(w.cols));
    std::vector<uint16_t> half(target == DType::F32 ? 0 : size_t(w.cols));
    const auto* src = static_cast<const uint8_t*>(w.data);
    for (int64_t r = 0; r < w.rows; ++r) {
      dequantize_row(w.dtype, src + size_t(r) * in_row, row.data(), w.cols);
      const void* out = row.data();
      if (target != DType::F32) {
        for (int64_t i = 0; i < w.cols; ++i) {
          half[size_t(i)] = target == DType::F16 ? f32_to_fp16(row[size_t(i)]) : f32_to_bf16(row[size_t(i)]);
        }
        out = half.data();
      }
      backend.copy_to_device(buf.as<uint8_t>() + size_t(r) * out_row, out, out_row);
    }
  }
  const WeightView view{buf.get(), target, w.rows, w.cols};
  std::string format(dtype_name(target));
  if (!note.empty()) format += " (" + note + ")";
  return std::make_unique<BackendLinear>(backend, std::move(buf), view, std::move(format));
}

}  // namespace tessera
