// Speculative decoding: the drafting side of a decoder. Each step the engine asks it for up to k draft
// tokens per decoding sequence (cache look-ahead already reserved), the target model scores all k+1
// positions in one batched forward, and the same decoder's select() verifies them (DecodeItem.draft):
// it returns the accepted drafts and one more token. The engine then rolls the target's KV back to
// what was accepted (Cache::truncate), and the decoder rolls back whatever state its proposer keeps.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tessera/decoder.h"

namespace tessera {

class Attention;
class Backend;
class Cache;
class GgufFile;
class Model;
class Registry;
class Tokenizer;
struct PipelineSpec;

// What the pipeline lends a speculative decoder once it is built (attach()). The references live
// as long as the pipeline; a decoder may keep them (the pipeline destroys the decoder before them,
// except `model`, which it must not touch from its destructor).
struct SpeculationHost {
  const Registry& registry;
  const PipelineSpec& spec;  // for the other components' settings and the pipeline file's folder
  Backend& backend;
  std::shared_ptr<const GgufFile> file;  // the target's GGUF
  Model& model;                          // the target
  Cache& cache;                          // the target's KV cache
  Attention& attention;
  const Tokenizer& tokenizer;
};

// One sequence that may speculate this step.
struct DraftRequest {
  SeqId seq = 0;
  std::span<const int32_t> tokens;  // prompt and output; the target has KV for all but the last
  int64_t prompt_tokens = 0;
  SamplingParams params;
  uint64_t* rng_state = nullptr;  // the sequence's random stream (drafts at temperature > 0 draw from it)
  int64_t max_draft = 0;          // at most this many drafts (look-ahead granted, context left)
  std::vector<int32_t> draft;     // out: proposed continuation (may be empty)
};

class Speculator {
 public:
  virtual ~Speculator() = default;
  // Once, after the target is built; throws Error when the proposer cannot work with this target
  // (e.g. a draft model with another vocabulary).
  virtual void attach(const SpeculationHost& host) = 0;
  // Drafts to reserve cache room for in the next step of `seq` (0 = do not speculate now).
  virtual int64_t lookahead(SeqId seq) const = 0;
  // Fills each request's draft; the target cache already has room for tokens.size() + max_draft.
  virtual void propose(std::span<DraftRequest> requests) = 0;
  // The sequence finished, was cancelled or preempted: forget its state and free what it holds.
  virtual void release(SeqId seq) = 0;
};

// Counters over all sequences, kept by the engine (EngineStats::speculation).
struct SpeculationStats {
  int64_t verifications = 0;  // sequence-steps that verified at least one draft
  int64_t proposed = 0;       // draft tokens scored by the target
  int64_t accepted = 0;       // of which accepted
  double draft_seconds = 0;   // time in propose()
  double step_seconds = 0;    // time in Engine::step() while a speculative decoder is in use
  double acceptance_rate() const { return proposed == 0 ? 0.0 : double(accepted) / double(proposed); }
  // Accepted drafts per verification (each verification also yields one token of the target's).
  double mean_accepted_length() const { return verifications == 0 ? 0.0 : double(accepted) / double(verifications); }
  double draft_time_share() const { return step_seconds <= 0 ? 0.0 : draft_seconds / step_seconds; }
};

}  // namespace tessera
