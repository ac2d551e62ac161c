// quantizer: none — weights stay in floating point. F32/F16/BF16 are kept as stored (or converted
// to `dtype`); GGUF block formats are expanded to `dtype` once, at load.
#include <memory>
#include <string>
#include <vector>

#include "tessera/backend_linear.h"
#include "tessera/error.h"
#include "tessera/joined_weight.h"
#include "tessera/plugin.h"

namespace tessera {
namespace {

class NoneQuantizer final : public Quantizer {
 public:
  explicit NoneQuantizer(const Params& p) : dtype_(p.get_string("dtype")) {}

  std::unique_ptr<Linear> make_linear(Backend& backend, const WeightSource& w) override {
    std::optional<DType> target;  // auto: float as stored, blocks to f32
    if (dtype_ == "f32") target = DType::F32;
    if (dtype_ == "f16") target = DType::F16;
    if (dtype_ == "bf16") target = DType::BF16;
    return make_float_linear(backend, w, target, "quantizer 'none'");
  }

  // Every tensor is kept alike.
  std::unique_ptr<Linear> make_fused_linear(Backend& backend, std::span<const WeightSource> parts) override {
    const auto joined = JoinedWeight::join(parts);
    return joined ? make_linear(backend, joined->source()) : nullptr;
  }

 private:
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
