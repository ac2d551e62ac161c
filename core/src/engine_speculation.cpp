// The engine's part of speculative decoding: cache look-ahead for sequences that may draft, asking
// the decoder's speculator for drafts, widening each drafting sequence's forward to [last, drafts]
// with one logits row per position, and after verification keeping only the accepted drafts' KV.
#include <string>

#include "engine_sequence.h"
#include "tessera/error.h"

namespace tessera {

int64_t Engine::lookahead(const Sequence& s) const {
  if (speculator_ == nullptr) return 0;
  // Only a sequence in steady decoding (everything but its last token computed) drafts; a prefill or
  // a recomputation after preemption runs as usual first.
  const auto n = int64_t(s.tokens.size());
  if (s.result.tokens.empty() || s.computed != n - 1) return 0;
  // Accepted drafts plus the verifier's own token must stay within max_tokens and the context.
  const int64_t room = s.max_total - n - 1;
  return std::max<int64_t>(0, std::min(speculator_->lookahead(s.result.id), room));
}

void Engine::draft(std::vector<ForwardSeq>& batch, const std::vector<Sequence*>& batch_seqs, const Budget& budget) {
  if (speculator_ == nullptr) return;
  std::vector<DraftRequest> requests;
  std::vector<size_t> positions;
  for (size_t i = 0; i < batch.size(); ++i) {
    Sequence* s = batch_seqs[i];
    s->draft.clear();
    const int64_t room = budget.lookahead(s->result.id);
    const auto n = int64_t(s->tokens.size());
    if (room <= 0 || batch[i].start_pos != n - 1 || batch[i].tokens.size() != 1) continue;
    DraftRequest r;
    r.seq = s->result.id;
    r.tokens = s->tokens;
    r.prompt_tokens = int64_t(s->request.prompt.size());
    r.params = s->sampling;
    r.rng_state = &s->rng;
    r.max_draft = room;
    requests.push_back(std::move(r));
    positions.push_back(i);
  }
  if (requests.empty()) return;
  const double start = now();
  speculator_->propose(requests);
  {
    std::lock_guard lock(mutex_);
    stats_.speculation.draft_seconds += now() - start;
  }
  const int64_t vocab = pipeline_.model().config().vocab;
  for (size_t r = 0; r < requests.size(); ++r) {
    const DraftRequest& req = requests[r];
    if (req.draft.empty()) continue;
    if (int64_t(req.draft.size()) > req.max_draft) {
      throw Error("decoder proposed " + std::to_string(req.draft.size()) + " drafts where at most " +
                  std::to_string(req.max_draft) + " fit");
    }
    for (int32_t t : req.draft) {
      if (t < 0 || t >= vocab) throw Error("decoder proposed token id " + std::to_string(t) + " outside the vocabulary");
    }
    const size_t i = positions[r];
    Sequence* s = batch_seqs[i];
    s->draft = req.draft;
    if (s->constraint != nullptr) {
      // Drafts after the first one the constraint refuses cannot be kept: verify only up to it (that
      // one is kept so that the decoder rejects it and rolls its proposer back as usual).
      size_t ok = 0;
      while (ok < s->draft.size() && s->constraint->accept(s->draft[ok])) ++ok;
      s->constraint->rollback(int64_t(ok));
      s->draft.resize(std::min(s->draft.size(), ok + 1));
    }
    s->verify_tokens.assign(1, s->tokens.back());
    s->verify_tokens.insert(s->verify_tokens.end(), s->draft.begin(), s->draft.end());
    batch[i].tokens = s->verify_tokens;
    batch[i].logit_rows = int64_t(s->verify_tokens.size());
    batch[i].verifies = true;
  }
}

void Engine::settle_drafts(Sequence& s, const DecodeItem& item, int64_t tokens_before) {
  // The decoder returns the accepted drafts and one token of its own.
  const auto accepted = int64_t(item.tokens.size()) - 1;
  bool prefix = accepted >= 0 && accepted <= int64_t(item.draft.size());
  for (int64_t j = 0; prefix && j < accepted; ++j) prefix = item.tokens[size_t(j)] == item.draft[size_t(j)];
  if (!prefix) {
    throw Error("decoder '" + pipeline_.spec().components.at(ComponentKind::decoder).plugin +
                "' did not return an accepted prefix of the drafts plus one token");
  }
  // KV stands for the last token before the step and the accepted drafts; the slots of rejected
  // drafts are given back after the step (Engine::step) and overwritten when reused.
  s.computed = tokens_before + accepted;
  pipeline_.cache().mark_computed(s.result.id, s.computed);
  s.draft.clear();
  std::lock_guard lock(mutex_);
  ++stats_.speculation.verifications;
  stats_.speculation.proposed += int64_t(item.draft.size());
  stats_.speculation.accepted += accepted;
}

}  // namespace tessera
