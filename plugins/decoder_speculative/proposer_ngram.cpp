// Prompt lookup: when the last n tokens occurred before in the sequence (prompt or output), propose
// what followed them then. n goes from ngram_max down to ngram_min; the most recent match wins.
// No model runs, so drafting costs next to nothing; it pays off on text that repeats its context
// (summaries, code edits, quoting).
#include <algorithm>

#include "proposer.h"
#include "tessera/error.h"

namespace tessera::speculative {
namespace {

class NgramProposer final : public Proposer {
 public:
  explicit NgramProposer(const Params& p) : max_n_(p.get_int("ngram_max")), min_n_(p.get_int("ngram_min")) {
    if (min_n_ < 1 || max_n_ < min_n_) {
      throw Error("ngram_min=" + std::to_string(min_n_) + " and ngram_max=" + std::to_string(max_n_) +
                  " must satisfy 1 <= ngram_min <= ngram_max");
    }
  }

  void attach(const SpeculationHost&) override {}

  void propose(std::span<DraftRequest> requests, std::vector<Proposal>& proposals) override {
    proposals.assign(requests.size(), {});
    for (DraftRequest& r : requests) r.draft = lookup(r.tokens, r.max_draft);
  }

 private:
  std::vector<int32_t> lookup(std::span<const int32_t> t, int64_t k) const {
    const auto len = int64_t(t.size());
    for (int64_t n = std::min(max_n_, len - 1); n >= min_n_; --n) {
      const auto key = t.subspan(size_t(len - n));
      for (int64_t i = len - n - 1; i >= 0; --i) {
        if (!std::equal(key.begin(), key.end(), t.begin() + i)) continue;
        const int64_t from = i + n;
        const int64_t to = std::min(len, from + k);
        return {t.begin() + from, t.begin() + to};
      }
    }
    return {};
  }

  int64_t max_n_, min_n_;
};

}  // namespace

std::unique_ptr<Proposer> make_ngram_proposer(const Params& p) { return std::make_unique<NgramProposer>(p); }

}  // namespace tessera::speculative
