// decoder: sampling — greedy (temperature 0), or temperature with top-k, top-p and min-p filters;
// repetition (llama.cpp/HF), frequency and presence (OpenAI) penalties; log-probabilities of the
// chosen token and the top alternatives; a per-sequence random stream (same seed, same output,
// whatever the batch). The arithmetic lives in tessera/sampling.h, shared with other decoders.
#include <memory>

#include "tessera/plugin.h"
#include "tessera/sampling.h"

namespace tessera {
namespace {

class SamplingDecoder final : public Decoder {
 public:
  explicit SamplingDecoder(const Params& p) : defaults_(sampling_params_from(p)) {}

  SamplingParams default_params() const override { return defaults_; }

  void select(std::span<DecodeItem> items) override {
    for (DecodeItem& item : items) {
      item.tokens.clear();
      item.logprobs.clear();
      item.top_logprobs.clear();
      sampler_.select_one(item);
    }
  }

 private:
  SamplingParams defaults_;
  TokenSampler sampler_;
};

void register_sampling(Registrar& r) {
  r.add<Decoder>("sampling",
                 "Greedy, temperature, top-k, top-p, min-p, repetition/frequency/presence penalties, logprobs; "
                 "seeded per request",
                 sampling_param_specs(), [](const Params& p) { return std::make_unique<SamplingDecoder>(p); });
}

}  // namespace
}  // namespace tessera

TESSERA_PLUGIN("decoder_sampling", tessera::register_sampling)
