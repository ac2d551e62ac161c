// decoder: speculative — a proposer drafts up to `window` tokens per sequence, the target scores them
// all in one batched forward, and this decoder verifies: greedy keeps the drafts that equal the
// target's argmax (so the output is exactly plain greedy decoding's); with temperature it accepts
// draft x with probability min(1, p(x)/q(x)) and on rejection samples from max(0, p - q), which
// leaves the output distributed exactly as sampling from the target (Leviathan et al. 2023; Chen et
// al. 2023). p is the target's distribution after penalties, temperature and the top-k/top-p/min-p
// filters, so those settings mean what they mean without speculation. Either way one more token
// follows the accepted drafts (the correction, or a bonus when all were accepted).
//
// Adaptive window (adaptive: true): per sequence, grow by one after a fully accepted window (up to
// max_window), shrink by one when fewer than half were accepted and halve when none was, and stop
// speculating for a sequence whose mean acceptance falls below min_acceptance (after 4
// verifications), or at once when its first 2 verifications accepted nothing. Once drafts proved
// useless across sequences, new sequences start probing with a window of 1.
#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "proposer.h"
#include "tessera/error.h"
#include "tessera/plugin.h"

namespace tessera::speculative {
namespace {

class SpeculativeDecoder final : public Decoder, public Speculator {
 public:
  explicit SpeculativeDecoder(const Params& p)
      : defaults_(sampling_params_from(p)),
        kind_(p.get_string("proposer")),
        window_(p.get_int("window")),
        adaptive_(p.get_bool("adaptive")),
        max_window_(p.get_int("max_window")),
        min_acceptance_(p.get_float("min_acceptance")) {
    if (window_ < 1 || window_ > 64) throw Error("window=" + std::to_string(window_) + " must be in 1..64");
    if (adaptive_ && (max_window_ < window_ || max_window_ > 64)) {
      throw Error("max_window=" + std::to_string(max_window_) + " must be in window (" + std::to_string(window_) +
                  ")..64");
    }
    if (!(min_acceptance_ >= 0 && min_acceptance_ < 1)) {
      throw Error("min_acceptance=" + std::to_string(min_acceptance_) + " must be in [0, 1)");
    }
    if (kind_ == "ngram") {
      proposer_ = make_ngram_proposer(p);
    } else if (kind_ == "layer_skip") {
      proposer_ = make_layer_skip_proposer(p);
    } else {
      proposer_ = make_model_proposer(p, kind_);
    }
  }

  SamplingParams default_params() const override { return defaults_; }
  Speculator* speculator() override { return this; }

  void attach(const SpeculationHost& host) override { proposer_->attach(host); }

  int64_t lookahead(SeqId seq) const override {
    auto it = state_.find(seq);
    if (it == state_.end()) return start_window();
    return it->second.off ? 0 : it->second.window;
  }

  void propose(std::span<DraftRequest> requests) override {
    proposer_->propose(requests, proposals_);
    for (size_t i = 0; i < requests.size(); ++i) {
      if (requests[i].draft.size() > size_t(requests[i].max_draft)) requests[i].draft.resize(size_t(requests[i].max_draft));
      q_[requests[i].seq] = std::move(proposals_[i].q);
    }
  }

  void release(SeqId seq) override {
    proposer_->release(seq);
    state_.erase(seq);
    q_.erase(seq);
  }

  void select(std::span<DecodeItem> items) override {
    for (DecodeItem& item : items) {
      item.tokens.clear();
      item.logprobs.clear();
      item.top_logprobs.clear();
      if (item.draft.empty()) {
        sampler_.select_one(item);
        continue;
      }
      verify(item);
      const auto accepted = int64_t(item.tokens.size()) - 1;
      // The proposer keeps state for the history and the accepted drafts only.
      proposer_->rollback(item.seq, int64_t(item.history.size()) + accepted);
      adapt(item.seq, int64_t(item.draft.size()), accepted);
    }
  }

 private:
  struct SeqState {
    int64_t window = 0;
    int64_t verifications = 0;
    int64_t proposed = 0;
    int64_t accepted = 0;
    bool off = false;
  };

  void verify(DecodeItem& item) {
    const SamplingParams& p = item.params;
    const auto k = int64_t(item.draft.size());
    uint64_t local = p.seed;
    uint64_t& rng = item.rng_state != nullptr ? *item.rng_state : local;
    std::vector<std::vector<Candidate>> q;
    if (auto it = q_.find(item.seq); it != q_.end()) q = std::move(it->second), q_.erase(it);
    history_.assign(item.history.begin(), item.history.end());
    history_.insert(history_.end(), item.draft.begin(), item.draft.end());
    const auto len = item.history.size();
    for (int64_t j = 0; j <= k; ++j) {
      const float* row = item.logits + j * item.vocab;
      const std::span<const int32_t> seen(history_.data(), len + size_t(j));
      // Within a constraint, row j's mask is the state after the drafts before it: a draft the
      // grammar refuses has probability 0 and is rejected like any other.
      const float* l = sampler_.constrained(item, sampler_.penalized(p, row, item.vocab, seen, item.prompt_tokens),
                                            item.tokens_left - j);
      if (j == k) {  // every draft accepted: a bonus token from the last row
        const int32_t t = pick(p, l, item.vocab, rng);
        TokenSampler::advance(item, t);
        TokenSampler::record(item, row, t);
        return;
      }
      const int32_t x = item.draft[size_t(j)];
      if (p.temperature == 0.0) {
        const int32_t best = argmax(l, item.vocab);
        TokenSampler::advance(item, best);
        TokenSampler::record(item, row, best);
        if (best != x) return;
        continue;
      }
      sampling_distribution(p, l, item.vocab, target_);
      // Drafts from a model carry their distribution; others are a point mass at x (empty q).
      const std::span<const Candidate> qj =
          size_t(j) < q.size() ? std::span<const Candidate>(q[size_t(j)]) : std::span<const Candidate>();
      const DraftVerdict v = accept_or_resample(target_, qj, x, rng, residual_);
      TokenSampler::advance(item, v.token);
      TokenSampler::record(item, row, v.token);
      if (!v.accepted) return;
    }
  }

  int32_t pick(const SamplingParams& p, const float* logits, int64_t vocab, uint64_t& rng) {
    if (p.temperature == 0.0) return argmax(logits, vocab);
    sampling_distribution(p, logits, vocab, target_);
    return draw(target_, rng);
  }

  void adapt(SeqId seq, int64_t proposed, int64_t accepted) {
    auto [it, fresh] = state_.try_emplace(seq);
    SeqState& s = it->second;
    if (fresh) s.window = start_window();
    ++s.verifications;
    s.proposed += proposed;
    s.accepted += accepted;
    total_proposed_ += proposed;
    total_accepted_ += accepted;
    if (!adaptive_) return;
    if (accepted == proposed) {
      s.window = std::min(max_window_, s.window + 1);
    } else if (accepted == 0) {
      // Nothing accepted: halve, so that a useless draft stops costing a wide verification soon.
      s.window = std::max<int64_t>(1, s.window / 2);
    } else if (2 * accepted < proposed) {
      s.window = std::max<int64_t>(1, s.window - 1);
    }
    // A draft that has not matched once in two verifications is off at once (each wasted step costs
    // about one more target forward: BM_SpeculativeBadDraft); otherwise a few verifications first,
    // so that one unlucky step does not end speculation.
    if (s.verifications >= 2 && s.accepted == 0) s.off = true;
    if (s.verifications >= 4 && double(s.accepted) < min_acceptance_ * double(s.proposed)) s.off = true;
  }

  // Adaptive: once the drafts have proved useless across sequences (acceptance below min_acceptance
  // over 16+ drafts), a new sequence probes with one draft per step instead of `window`; a good draft
  // grows back by one per fully accepted step.
  int64_t start_window() const {
    if (adaptive_ && total_proposed_ >= 16 && double(total_accepted_) < min_acceptance_ * double(total_proposed_)) {
      return 1;
    }
    return window_;
  }

  SamplingParams defaults_;
  std::string kind_;
  int64_t total_proposed_ = 0, total_accepted_ = 0;
  int64_t window_;
  bool adaptive_;
  int64_t max_window_;
  double min_acceptance_;
  std::unique_ptr<Proposer> proposer_;
  std::vector<Proposal> proposals_;
  std::unordered_map<SeqId, std::vector<std::vector<Candidate>>> q_;
  std::unordered_map<SeqId, SeqState> state_;
  TokenSampler sampler_;
  std::vector<int32_t> history_;
  std::vector<Candidate> target_, residual_;
};

void register_speculative(Registrar& r) {
  std::vector<ParamSpec> params = sampling_param_specs();
  std::vector<ParamSpec> own = {
      {"proposer", ParamType::string, "ngram",
       "where drafts come from: ngram (prompt lookup), layer_skip (first N layers of the target), draft_model "
       "(another GGUF, same vocabulary), self_quantized (the target through draft_quantizer)",
       {"ngram", "layer_skip", "draft_model", "self_quantized"}},
      {"window", ParamType::integer, 4, "drafts per step (k), 1..64; the start value when adaptive", {}},
      {"adaptive", ParamType::boolean, false,
       "per sequence: grow the window after full acceptance, shrink it on low acceptance, turn speculation off "
       "when acceptance collapses",
       {}},
      {"max_window", ParamType::integer, 8, "largest window when adaptive", {}},
      {"min_acceptance", ParamType::number, 0.1,
       "adaptive: stop speculating for a sequence whose acceptance rate falls below this (after 4 verifications; "
       "after 2 when nothing was accepted)",
       {}},
      {"ngram_max", ParamType::integer, 3, "ngram: longest suffix to look up", {}},
      {"ngram_min", ParamType::integer, 1, "ngram: shortest suffix to look up", {}},
      {"layers", ParamType::integer, 0, "layer_skip: layers the draft runs (0 = half the target's)", {}},
      {"draft_model", ParamType::string, "", "draft_model: GGUF file of the draft (same vocabulary as the target)", {}},
      {"draft_quantizer", ParamType::string, "",
       "quantizer plugin for the draft weights: self_quantized's (empty = int4); draft_model's (empty = the "
       "target's quantizer; e.g. gguf keeps a Q8_0 draft in its blocks)",
       {}},
      {"draft_memory", ParamType::size, "64MiB", "draft_model / self_quantized: the draft's KV cache (paged)", {}}};
  params.insert(params.end(), own.begin(), own.end());
  r.add<Decoder>("speculative",
                 "Speculative decoding: ngram / layer_skip / draft_model / self_quantized drafts verified in one "
                 "target forward; exact for greedy, rejection sampling otherwise; fixed or adaptive window",
                 std::move(params), [](const Params& p) { return std::make_unique<SpeculativeDecoder>(p); });
}

}  // namespace
}  // namespace tessera::speculative

TESSERA_PLUGIN("decoder_speculative", tessera::speculative::register_speculative)
