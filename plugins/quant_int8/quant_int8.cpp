// quantizer: int8 — W8A8. Weights are symmetric int8 per output channel (scale = absmax/127),
// activations are quantized per token at run time inside the backend's gemm, products accumulate
// in int32 and the output is dequantized as it is written. Tensors named by `keep_float` stay in
// floating point exactly as quantizer `none` keeps them.
#include <memory>
#include <string>
#include <vector>

#include "tessera/backend_linear.h"
#include "tessera/cpu_int_kernel.h"
#include "tessera/joined_weight.h"
#include "tessera/plugin.h"
#include "tessera/tensor_pattern.h"

namespace tessera {
namespace {

class Int8Quantizer final : public Quantizer {
 public:
  explicit Int8Quantizer(const Params& p)
      : keep_float_(p.get_string_list("keep_float")),
        cpu_variant_(cpu_int_kernel_variant(p.get_string("kernel"))) {}

  std::unique_ptr<Linear> make_linear(Backend& backend, const WeightSource& w) override {
    return build(backend, w, tensor_matches_any(keep_float_, w.name));
  }

  // Rows are quantized one by one (a scale each), so parts that keep_float treats alike join.
  std::unique_ptr<Linear> make_fused_linear(Backend& backend, std::span<const WeightSource> parts) override {
    const auto joined = JoinedWeight::join(parts);
    if (!joined) return nullptr;
    const bool keep = tensor_matches_any(keep_float_, parts[0].name);
    for (const WeightSource& p : parts) {
      if (tensor_matches_any(keep_float_, p.name) != keep) return nullptr;
    }
    return build(backend, joined->source(), keep);
  }

 private:
  std::unique_ptr<Linear> build(Backend& backend, const WeightSource& w, bool keep_float) {
    if (keep_float) return make_float_linear(backend, w, std::nullopt, "quantizer 'int8' (keep_float)");
    return make_int8_linear(backend, w, cpu_variant_, "quantizer 'int8'");
  }

  std::vector<std::string> keep_float_;
  int32_t cpu_variant_;
};

void register_int8(Registrar& r) {
  r.add<Quantizer>(
      "int8",
      "W8A8: int8 weights per output channel, int8 activations per token (dynamic), int32 accumulation",
      {{"keep_float", ParamType::string_list, nlohmann::json::array(),
        "tensor-name patterns kept in floating point, e.g. [output, \"blk.0.*\"]", {}},
       {"kernel", ParamType::string, "auto",
        std::string("CPU kernel: ") + kCpuIntKernelDoc + kCpuInt8DnnlDoc +
            "; all give the same results. auto runs prefills (k a multiple of 64) on AMX tiles where the CPU has "
            "AMX-INT8. Other backends use their own",
        cpu_int8_kernels()}},
      [](const Params& p) { return std::make_unique<Int8Quantizer>(p); });
}

}  // namespace
}  // namespace tessera

TESSERA_PLUGIN("quant_int8", tessera::register_int8)
