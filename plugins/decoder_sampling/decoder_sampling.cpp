// decoder: sampling — greedy (temperature 0), or temperature with top-k, top-p and min-p filters;
// repetition (llama.cpp/HF), frequency and presence (OpenAI) penalties; log-probabilities of the
// chosen token and the top alternatives; a per-sequence random stream (same seed, same output,
// whatever the batch). The arithmetic lives in tessera/sampling.h, shared with other decoders.
#include <memory>
#include <string>
#include <vector>

#include "tessera/plugin.h"
#include "tessera/sampling.h"

namespace tessera {
namespace {

class SamplingDecoder final : public Decoder {
 public:
  explicit SamplingDecoder(const Params& p) {
    defaults_.temperature = p.get_float("temperature");
    defaults_.top_k = p.get_int("top_k");
    defaults_.top_p = p.get_float("top_p");
    defaults_.min_p = p.get_float("min_p");
    defaults_.repetition_penalty = p.get_float("repetition_penalty");
    defaults_.frequency_penalty = p.get_float("frequency_penalty");
    defaults_.presence_penalty = p.get_float("presence_penalty");
    defaults_.seed = static_cast<uint64_t>(p.get_int("seed"));
    validate_sampling(defaults_);
  }

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
                 {{"temperature", ParamType::number, 0.0, "0 = greedy", {}},
                  {"top_k", ParamType::integer, 0, "keep the k most likely tokens; 0 = off", {}},
                  {"top_p", ParamType::number, 1.0, "nucleus: smallest set with this probability mass", {}},
                  {"min_p", ParamType::number, 0.0, "drop tokens below min_p x the top probability", {}},
                  {"repetition_penalty", ParamType::number, 1.0,
                   "divide positive (multiply negative) logits of tokens in prompt or output (1 = off)", {}},
                  {"frequency_penalty", ParamType::number, 0.0,
                   "subtract this x the count of each token generated so far (-2..2; 0 = off)", {}},
                  {"presence_penalty", ParamType::number, 0.0,
                   "subtract this once from each token generated so far (-2..2; 0 = off)", {}},
                  {"seed", ParamType::integer, 0, "default random seed for requests that give none", {}}},
                 [](const Params& p) { return std::make_unique<SamplingDecoder>(p); });
}

}  // namespace
}  // namespace tessera

TESSERA_PLUGIN("decoder_sampling", tessera::register_sampling)
