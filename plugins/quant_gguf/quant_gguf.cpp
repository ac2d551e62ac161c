// quantizer: gguf — weights run in the format the file stores them in. GGUF blocks (Q8_0, Q4_0,
// Q4_K, Q6_K) are uploaded byte for byte and multiplied by the backend's block kernels; float
// tensors stay in their float type. There is no float copy of a block-quantized matrix, unless a
// `keep_float` pattern asks for one (sensitive layers).
#include <memory>
#include <string>
#include <vector>

#include "tessera/device_buffer.h"
#include "tessera/error.h"
#include "tessera/plugin.h"
#include "tessera/tensor_pattern.h"

namespace tessera {
namespace {

class StoredLinear final : public Linear {
 public:
  StoredLinear(Backend& backend, DeviceBuffer buffer, WeightView view, std::string format)
      : backend_(backend), buffer_(std::move(buffer)), view_(view), format_(std::move(format)) {}
  void forward(const float* x, int64_t m, float* y) override { backend_.gemm(x, m, view_, y); }
  int64_t in_features() const override { return view_.cols; }
  int64_t out_features() const override { return view_.rows; }
  size_t resident_bytes() const override { return buffer_.size(); }
  std::string format() const override { return format_; }
  WeightView view() const override { return view_; }

 private:
  Backend& backend_;
  DeviceBuffer buffer_;
  WeightView view_;
  std::string format_;
};

class GgufQuantizer final : public Quantizer {
 public:
  explicit GgufQuantizer(const Params& p) : keep_float_(p.get_string_list("keep_float")) {}

  std::unique_ptr<Linear> make_linear(Backend& backend, const WeightSource& w) override {
    const bool keep_float = !dtype_is_float(w.dtype) && tensor_matches_any(keep_float_, w.name);
    const DType target = keep_float ? DType::F32 : w.dtype;
    if (!backend.supports(Op::gemm, target)) {
      throw Error("quantizer 'gguf' runs " + w.name + " as stored (" + std::string(dtype_name(target)) +
                  "), but the " + std::string(backend.name()) + " backend lacks gemm on " +
                  std::string(dtype_name(target)) + "; keep it in float with keep_float: [" + w.name +
                  "] or use quantizer 'none'");
    }
    const size_t bytes = dtype_row_bytes(target, w.cols) * size_t(w.rows);
    DeviceBuffer buf(backend, bytes);
    if (!keep_float) {
      buf.upload(w.data, bytes);  // as stored, byte for byte
    } else {
      std::vector<float> host(size_t(w.rows * w.cols));
      const size_t in_row = dtype_row_bytes(w.dtype, w.cols);
      for (int64_t r = 0; r < w.rows; ++r) {
        dequantize_row(w.dtype, static_cast<const uint8_t*>(w.data) + size_t(r) * in_row, host.data() + r * w.cols,
                       w.cols);
      }
      buf.upload(host.data(), bytes);
    }
    WeightView view{buf.get(), target, w.rows, w.cols};
    std::string format(dtype_name(target));
    if (keep_float) format += " (keep_float)";
    return std::make_unique<StoredLinear>(backend, std::move(buf), view, std::move(format));
  }

 private:
  std::vector<std::string> keep_float_;
};

void register_gguf(Registrar& r) {
  r.add<Quantizer>(
      "gguf",
      "Weights as the GGUF file stores them: Q8_0/Q4_0/Q4_K/Q6_K blocks run by the backend's block "
      "kernels without a float copy; float tensors stay float",
      {{"keep_float", ParamType::string_list, nlohmann::json::array(),
        "tensor-name patterns expanded to f32 at load, e.g. [output, \"blk.0.*\"]"}},
      [](const Params& p) { return std::make_unique<GgufQuantizer>(p); });
}

}  // namespace
}  // namespace tessera

TESSERA_PLUGIN("quant_gguf", tessera::register_gguf)
