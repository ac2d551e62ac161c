// Proposers: where a speculative decoder's drafts come from. One sub-interface, chosen in YAML
// (`proposer:`): ngram (prompt lookup), layer_skip (the target's first N layers + its output head),
// draft_model (another GGUF with the same vocabulary, its own KV cache) and self_quantized (the
// target's weights through another quantizer, e.g. int4, its own KV cache).
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tessera/params.h"
#include "tessera/sampling.h"
#include "tessera/speculative.h"

namespace tessera::speculative {

// Per request: the distribution each draft was drawn from (rejection sampling needs it). Empty when
// the drafts are deterministic (a point mass at each draft token).
struct Proposal {
  std::vector<std::vector<Candidate>> q;
};

class Proposer {
 public:
  virtual ~Proposer() = default;
  virtual void attach(const SpeculationHost& host) = 0;
  // Fills requests[i].draft (at most max_draft tokens) and proposals[i] (sized like requests).
  virtual void propose(std::span<DraftRequest> requests, std::vector<Proposal>& proposals) = 0;
  // Only the first `tokens` tokens of `seq` stand (the rest were rejected): drop state past them.
  virtual void rollback(SeqId /*seq*/, int64_t /*tokens*/) {}
  virtual void release(SeqId /*seq*/) {}
};

std::unique_ptr<Proposer> make_ngram_proposer(const Params& p);
std::unique_ptr<Proposer> make_layer_skip_proposer(const Params& p);
// proposer "draft_model" (draft_model: PATH) or "self_quantized" (draft_quantizer: NAME).
std::unique_ptr<Proposer> make_model_proposer(const Params& p, const std::string& kind);

}  // namespace tessera::speculative
