// decoder: sampling — greedy (temperature 0), or temperature with top-k, top-p and min-p filters,
// repetition penalty, and a per-sequence random stream (same seed, same output, whatever the batch).
#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <string>
#include <unordered_set>
#include <vector>

#include "tessera/error.h"
#include "tessera/plugin.h"

namespace tessera {
namespace {

// splitmix64: tiny, statistically sound, and its whole state is one integer kept per sequence.
uint64_t next_random(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double uniform01(uint64_t& state) { return double(next_random(state) >> 11) * (1.0 / 9007199254740992.0); }

int32_t argmax(const float* v, int64_t n) {
  return static_cast<int32_t>(std::max_element(v, v + n) - v);
}

class SamplingDecoder final : public Decoder {
 public:
  explicit SamplingDecoder(const Params& p) {
    defaults_.temperature = p.get_float("temperature");
    defaults_.top_k = p.get_int("top_k");
    defaults_.top_p = p.get_float("top_p");
    defaults_.min_p = p.get_float("min_p");
    defaults_.repetition_penalty = p.get_float("repetition_penalty");
    defaults_.seed = static_cast<uint64_t>(p.get_int("seed"));
    validate_sampling(defaults_);
  }

  SamplingParams default_params() const override { return defaults_; }

  void select(std::span<DecodeItem> items) override {
    for (DecodeItem& item : items) item.tokens.assign(1, choose(item));
  }

 private:
  int32_t choose(DecodeItem& item) {
    const SamplingParams& p = item.params;
    const float* logits = item.logits;
    if (p.repetition_penalty != 1.0 && !item.history.empty()) {
      penalized_.assign(logits, logits + item.vocab);
      std::unordered_set<int32_t> seen(item.history.begin(), item.history.end());
      for (int32_t t : seen) {
        if (t < 0 || t >= item.vocab) continue;
        float& l = penalized_[size_t(t)];
        l = l > 0 ? l / float(p.repetition_penalty) : l * float(p.repetition_penalty);
      }
      logits = penalized_.data();
    }
    if (p.temperature == 0.0) return argmax(logits, item.vocab);

    // Candidates sorted by logit, cut by top-k, then softmax, then top-p and min-p.
    order_.resize(size_t(item.vocab));
    std::iota(order_.begin(), order_.end(), 0);
    int64_t keep = item.vocab;
    if (p.top_k > 0) keep = std::min(keep, p.top_k);
    std::partial_sort(order_.begin(), order_.begin() + keep, order_.end(),
                      [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    order_.resize(size_t(keep));
    probs_.resize(size_t(keep));
    const double top = logits[order_[0]];
    double sum = 0;
    for (int64_t i = 0; i < keep; ++i) {
      probs_[size_t(i)] = std::exp((double(logits[order_[size_t(i)]]) - top) / p.temperature);
      sum += probs_[size_t(i)];
    }
    for (auto& pr : probs_) pr /= sum;
    int64_t n = keep;
    if (p.min_p > 0) {
      const double floor = p.min_p * probs_[0];
      while (n > 1 && probs_[size_t(n - 1)] < floor) --n;
    }
    if (p.top_p < 1.0) {
      double cum = 0;
      int64_t i = 0;
      for (; i < n; ++i) {
        cum += probs_[size_t(i)];
        if (cum >= p.top_p) break;
      }
      n = std::min(n, i + 1);
    }
    double mass = 0;
    for (int64_t i = 0; i < n; ++i) mass += probs_[size_t(i)];
    double r = uniform01(*item.rng_state) * mass;
    for (int64_t i = 0; i < n; ++i) {
      r -= probs_[size_t(i)];
      if (r <= 0) return order_[size_t(i)];
    }
    return order_[size_t(n - 1)];
  }

  SamplingParams defaults_;
  std::vector<float> penalized_;
  std::vector<int32_t> order_;
  std::vector<double> probs_;
};

void register_sampling(Registrar& r) {
  r.add<Decoder>("sampling", "Greedy, temperature, top-k, top-p, min-p, repetition penalty; seeded per request",
                 {{"temperature", ParamType::number, 0.0, "0 = greedy", {}},
                  {"top_k", ParamType::integer, 0, "keep the k most likely tokens; 0 = off", {}},
                  {"top_p", ParamType::number, 1.0, "nucleus: smallest set with this probability mass", {}},
                  {"min_p", ParamType::number, 0.0, "drop tokens below min_p x the top probability", {}},
                  {"repetition_penalty", ParamType::number, 1.0, "divide logits of seen tokens (1 = off)", {}},
                  {"seed", ParamType::integer, 0, "default random seed for requests that give none", {}}},
                 [](const Params& p) { return std::make_unique<SamplingDecoder>(p); });
}

}  // namespace
}  // namespace tessera

TESSERA_PLUGIN("decoder_sampling", tessera::register_sampling)
