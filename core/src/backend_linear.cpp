#include "tessera/backend_linear.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
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
          // A weight past f16's range would become infinity and every logit it reaches NaN.
          if (target == DType::F16 && !std::isfinite(fp16_to_f32(half[size_t(i)]))) {
            throw Error(who + ": tensor " + w.name + " row " + std::to_string(r) + " holds " +
                        std::to_string(row[size_t(i)]) + ", past f16's range (65504): use bf16 or f32");
          }
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

namespace {

// Rows are quantized and uploaded in pieces of about this size, so loading never stages a second
// copy of a whole large matrix on the host.
constexpr size_t kInt8StageBytes = size_t(4) << 20;

// std::lround's rounding (halves away from zero) for |v| < 2^23, where v - trunc(v) is exact;
// truncating through int32 is one SSE2 instruction (std::trunc is a libm call without SSE4.1).
float round_half_away(float v) {
  const float t = float(int32_t(v));
  const float d = v - t;
  return t + (float(d >= 0.5f) - float(d <= -0.5f));
}

// Symmetric per-row quantization: scale = absmax/127, q = round(x/scale); an all-zero row gets
// scale 0 and zeros. Without lround (a libm call per weight was a tenth of loading a model) and
// without branches per element, which random weights mispredict half the time.
float quantize_int8_row(const float* x, int64_t k, int8_t* q, const std::string& who, const std::string& name,
                        int64_t r) {
  float amax = 0;
  bool finite = true;
  for (int64_t c = 0; c < k; ++c) {
    const float a = std::fabs(x[c]);
    finite &= a <= std::numeric_limits<float>::max();  // false for NaN and infinity
    amax = std::max(amax, a);
  }
  if (!finite) throw Error(who + ": tensor " + name + " has a non-finite value in row " + std::to_string(r));
  const float scale = amax / 127.0f;
  if (!(scale > 0)) {
    std::fill(q, q + k, int8_t(0));
    return scale;
  }
  for (int64_t c = 0; c < k; ++c) q[c] = int8_t(std::min(std::max(round_half_away(x[c] / scale), -127.0f), 127.0f));
  return scale;
}

}  // namespace

std::unique_ptr<Linear> make_int8_linear(Backend& backend, const WeightSource& w, int32_t cpu_variant,
                                         const std::string& who) {
  if (!backend.supports(Op::gemm, DType::I8)) {
    throw Error(who + " needs gemm on i8 on the " + std::string(backend.name()) + " backend (tensor " + w.name +
                "); keep it in float with keep_float or use quantizer 'none'");
  }
  const int64_t k = w.cols;
  DeviceBuffer data(backend, size_t(w.rows) * size_t(k));
  DeviceBuffer scales(backend, size_t(w.rows) * sizeof(float));
  std::vector<float> host_scales(size_t(w.rows));
  const int64_t rows_per_stage = std::max<int64_t>(1, int64_t(kInt8StageBytes / size_t(k)));
  std::vector<int8_t> stage(size_t(std::min(rows_per_stage, w.rows) * k));
  std::vector<float> row(static_cast<size_t>(k));
  const size_t in_row = dtype_row_bytes(w.dtype, k);
  const auto* src = static_cast<const uint8_t*>(w.data);
  for (int64_t r0 = 0; r0 < w.rows; r0 += rows_per_stage) {
    const int64_t r1 = std::min(w.rows, r0 + rows_per_stage);
    for (int64_t r = r0; r < r1; ++r) {
      dequantize_row(w.dtype, src + size_t(r) * in_row, row.data(), k);
      host_scales[size_t(r)] = quantize_int8_row(row.data(), k, stage.data() + (r - r0) * k, who, w.name, r);
    }
    backend.copy_to_device(data.as<int8_t>() + r0 * k, stage.data(), size_t((r1 - r0) * k));
  }
  scales.upload(host_scales.data(), host_scales.size() * sizeof(float));
  WeightView view{data.get(), DType::I8, w.rows, w.cols, scales.as<float>()};
  // Variant numbers belong to the backend; only the CPU's are known to quantizers.
  view.kernel_variant = backend.name() == "cpu" ? cpu_variant : 0;
  // A zero-row gemm only validates the view: a variant this backend build lacks is refused now,
  // naming the tensor, rather than at the first step.
  if (view.kernel_variant != 0) {
    try {
      backend.gemm(nullptr, 0, view, nullptr);
    } catch (const Error& e) {
      throw Error(who + " (tensor " + w.name + "): " + e.what());
    }
  }
  return std::make_unique<BackendLinear>(backend, std::move(data), view, "int8", std::move(scales));
}

}  // namespace tessera
