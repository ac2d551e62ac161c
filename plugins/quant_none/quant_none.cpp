// quantizer: none — weights stay in floating point. F32/F16/BF16 are kept as stored (or converted
// to `dtype`); GGUF block formats are expanded to `dtype` once, at load.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tessera/device_buffer.h"
#include "tessera/error.h"
#include "tessera/plugin.h"

namespace tessera {
namespace {

class FloatLinear final : public Linear {
 public:
  FloatLinear(Backend& backend, DeviceBuffer buffer, WeightView view)
      : backend_(backend), buffer_(std::move(buffer)), view_(view) {}
  void forward(const float* x, int64_t m, float* y) override { backend_.gemm(x, m, view_, y); }
  int64_t in_features() const override { return view_.cols; }
  int64_t out_features() const override { return view_.rows; }
  size_t resident_bytes() const override { return buffer_.size(); }
  std::string format() const override { return std::string(dtype_name(view_.dtype)); }
  WeightView view() const override { return view_; }

 private:
  Backend& backend_;
  DeviceBuffer buffer_;
  WeightView view_;
};

class NoneQuantizer final : public Quantizer {
 public:
  explicit NoneQuantizer(const Params& p) : dtype_(p.get_string("dtype")) {}

  std::unique_ptr<Linear> make_linear(Backend& backend, const WeightSource& w) override {
    const DType target = target_dtype(w.dtype);
    if (!backend.supports(Op::gemm, target)) {
      throw Error("quantizer 'none' needs gemm on " + std::string(dtype_name(target)) + " on the " +
                  std::string(backend.name()) + " backend (tensor " + w.name + ")");
    }
    const size_t bytes = dtype_row_bytes(target, w.cols) * size_t(w.rows);
    DeviceBuffer buf(backend, bytes);
    if (target == w.dtype) {
      buf.upload(w.data, bytes);
    } else {
      buf.upload(convert(w, target).data(), bytes);
    }
    WeightView view{buf.get(), target, w.rows, w.cols};
    return std::make_unique<FloatLinear>(backend, std::move(buf), view);
  }

 private:
  DType target_dtype(DType stored) const {
    if (dtype_ == "f32") return DType::F32;
    if (dtype_ == "f16") return DType::F16;
    if (dtype_ == "bf16") return DType::BF16;
    return dtype_is_float(stored) ? stored : DType::F32;  // auto
  }

  static std::vector<uint8_t> convert(const WeightSource& w, DType target) {
    const size_t in_row = dtype_row_bytes(w.dtype, w.cols);
    const size_t out_row = dtype_row_bytes(target, w.cols);
    std::vector<uint8_t> out(out_row * size_t(w.rows));
    std::vector<float> row(size_t(w.cols));
    const auto* src = static_cast<const uint8_t*>(w.data);
    for (int64_t r = 0; r < w.rows; ++r) {
      dequantize_row(w.dtype, src + size_t(r) * in_row, row.data(), w.cols);
      uint8_t* dst = out.data() + size_t(r) * out_row;
      if (target == DType::F32) {
        std::memcpy(dst, row.data(), out_row);
      } else {
        auto* h = reinterpret_cast<uint16_t*>(dst);
        for (int64_t i = 0; i < w.cols; ++i) {
          h[i] = target == DType::F16 ? f32_to_fp16(row[size_t(i)]) : f32_to_bf16(row[size_t(i)]);
        }
      }
    }
    return out;
  }

  std::string dtype_;
};

void register_none(Registrar& r) {
  r.add<Quantizer>(
      "none", "Floating-point weights: f32/f16/bf16 as stored; GGUF blocks expanded to floats at load",
      {{"dtype", ParamType::string, "auto",
        "weight type on the backend: auto (float as stored, blocks to f32), f32, f16 or bf16",
        {"auto", "f32", "f16", "bf16"}}},
      [](const Params& p) { return std::make_unique<NoneQuantizer>(p); });
}

}  // namespace
}  // namespace tessera

TESSERA_PLUGIN("quant_none", tessera::register_none)
