// attention: gqa — dense causal attention for MHA, GQA and MQA (the head counts decide), reading
// K/V from the cache's blocks; optional sliding window.
#include <memory>
#include <string>

#include "tessera/error.h"
#include "tessera/plugin.h"

namespace tessera {
namespace {

class GqaAttention final : public Attention {
 public:
  explicit GqaAttention(const Params& p) : window_override_(p.get_int("window")) {
    if (window_override_ < 0) throw Error("attention gqa: window must be >= 0, got " + std::to_string(window_override_));
  }

  void configure(const AttentionShape& shape) override {
    if (shape.n_kv_heads <= 0 || shape.n_heads % shape.n_kv_heads != 0) {
      throw Error("attention gqa: " + std::to_string(shape.n_heads) + " query heads cannot be grouped over " +
                  std::to_string(shape.n_kv_heads) + " kv heads");
    }
    shape_ = shape;
    if (window_override_ > 0) shape_.window = window_override_;
  }

  std::vector<OpRequirement> requirements(DType kv_dtype) const override {
    return {{Op::kv_write, kv_dtype, "attention gqa"}, {Op::attention, kv_dtype, "attention gqa"}};
  }

  void forward(Backend& backend, const AttentionStep& step, const KvLayerView& kv, const float* q,
               const float* k, const float* v, float* out) override {
    backend.kv_write(kv, k, v, step.slots, step.n_tokens);
    backend.attention(dense_attention_args(step, shape_, q, out), kv);
  }

 private:
  int64_t window_override_;
  AttentionShape shape_;
};

void register_gqa(Registrar& r) {
  r.add<Attention>("gqa", "Dense causal attention (MHA/GQA/MQA by head counts) over paged KV",
                   {{"window", ParamType::integer, 0,
                     "sliding window in tokens; 0 = the model's own (GGUF metadata) or none", {}}},
                   [](const Params& p) { return std::make_unique<GqaAttention>(p); });
}

}  // namespace
}  // namespace tessera

TESSERA_PLUGIN("attention_gqa", tessera::register_gqa)
