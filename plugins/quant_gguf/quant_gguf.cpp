// quantizer: gguf — weights run in the format the file stores them in. GGUF blocks (Q8_0, Q4_0,
// Q4_1, Q5_0, Q5_1, Q2_K-Q6_K, IQ4_NL, IQ4_XS, IQ2_XXS-IQ3_S) are uploaded byte for byte and multiplied by the
// backend's block kernels; float tensors stay in their float type. There is no float copy of a block-quantized matrix, unless a
// `keep_float` pattern asks for one (sensitive layers).
#include <memory>
#include <string>
#include <vector>

#include "tessera/backend_linear.h"
#include "tessera/device_buffer.h"
#include "tessera/error.h"
#include "tessera/joined_weight.h"
#include "tessera/plugin.h"
#include "tessera/tensor_pattern.h"

namespace tessera {
namespace {

class GgufQuantizer final : public Quantizer {
 public:
  explicit GgufQuantizer(const Params& p) : keep_float_(p.get_string_list("keep_float")) {}

  std::unique_ptr<Linear> make_linear(Backend& backend, const WeightSource& w) override {
    return build(backend, w, expands(w));
  }

  // Parts stored alike (one type, all or none expanded by keep_float) are joined.
  std::unique_ptr<Linear> make_fused_linear(Backend& backend, std::span<const WeightSource> parts) override {
    const auto joined = JoinedWeight::join(parts);
    if (!joined) return nullptr;
    for (const WeightSource& p : parts) {
      if (expands(p) != expands(parts[0])) return nullptr;
    }
    return build(backend, joined->source(), expands(parts[0]));
  }

 private:
  bool expands(const WeightSource& w) const {
    return !dtype_is_float(w.dtype) && tensor_matches_any(keep_float_, w.name);
  }

  std::unique_ptr<Linear> build(Backend& backend, const WeightSource& w, bool expand) {
    if (expand) {
      return make_float_linear(backend, w, DType::F32, "quantizer 'gguf' (keep_float)", "keep_float");
    }
    if (!backend.supports(Op::gemm, w.dtype)) {
      throw Error("quantizer 'gguf' runs " + w.name + " as stored (" + std::string(dtype_name(w.dtype)) +
                  "), but the " + std::string(backend.name()) + " backend lacks gemm on " +
                  std::string(dtype_name(w.dtype)) + "; keep it in float with keep_float: [" + w.name +
                  "] or use quantizer 'none'");
    }
    DeviceBuffer buf(backend, dtype_row_bytes(w.dtype, w.cols) * size_t(w.rows));
    buf.upload(w.data, buf.size());  // as stored, byte for byte
    const WeightView view{buf.get(), w.dtype, w.rows, w.cols};
    return std::make_unique<BackendLinear>(backend, std::move(buf), view, std::string(dtype_name(w.dtype)));
  }

  std::vector<std::string> keep_float_;
};

void register_gguf(Registrar& r) {
  r.add<Quantizer>(
      "gguf",
      "Weights as the GGUF file stores them: Q8_0/Q4_0/Q4_1/Q5_0/Q5_1, Q2_K-Q6_K, IQ4_NL/IQ4_XS and "
      "IQ2_XXS/IQ2_XS/IQ2_S/IQ3_XXS/IQ3_S blocks run by the backend's block kernels without a float copy; float tensors stay float",
      {{"keep_float", ParamType::string_list, nlohmann::json::array(),
        "tensor-name patterns expanded to f32 at load, e.g. [output, \"blk.0.*\"]"}},
      [](const Params& p) { return std::make_unique<GgufQuantizer>(p); });
}

}  // namespace
}  // namespace tessera

TESSERA_PLUGIN("quant_gguf", tessera::register_gguf)
