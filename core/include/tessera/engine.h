// The engine: a request queue and the step loop. Each step the scheduler picks the work, the cache
// provides blocks, the model runs one ragged batch and the decoder picks tokens, which are streamed
// to their requests. submit(), cancel(), take_finished() and stats() may be called from any thread;
// step() runs on one thread at a time, and token callbacks run on that thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "tessera/decoder.h"
#include "tessera/pipeline.h"
#include "tessera/speculative.h"

namespace tessera {

using RequestId = SeqId;

// eos: the model's end token; stop: a caller's stop token; length: max_tokens or the context.
enum class FinishReason : uint8_t { none, eos, stop, length, cancelled, error };
std::string_view finish_reason_name(FinishReason r);

struct GenerationRequest {
  std::vector<int32_t> prompt;  // token ids (with BOS where the model wants it)
  int64_t max_tokens = 128;
  int64_t expected_output = 0;  // hint for length-aware scheduling; 0 = max_tokens
  std::optional<SamplingParams> sampling;  // absent: the decoder's defaults
  std::string user = "anonymous";
  int32_t priority = 0;
  bool retain = true;
  bool ignore_eos = false;
  std::vector<int32_t> stop_tokens;  // in addition to EOS
  // Generation ends when the text contains one of these; the result's text stops before it.
  std::vector<std::string> stop;
  // Structured output: the generated tokens stay inside this constraint (compiled by
  // Pipeline::constraint()); generation ends when it is complete. Null = unconstrained.
  std::shared_ptr<const CompiledConstraint> constraint;
  // Called for every generated token, in order.
  std::function<void(RequestId, int32_t token)> on_token;
  // Called with generated text as soon as it can no longer become part of a stop string
  // (concatenated, the pieces equal GenerationResult::text).
  std::function<void(RequestId, std::string_view text)> on_text;
};

struct GenerationResult {
  RequestId id = 0;
  std::vector<int32_t> prompt;
  std::vector<int32_t> tokens;
  std::string text;  // detokenized output, cut before a matched stop string
  std::vector<float> logprobs;                          // per generated token
  std::vector<std::vector<TokenLogprob>> top_logprobs;  // per generated token, when requested
  int64_t cached_tokens = 0;  // prompt tokens whose KV came from the prefix cache
  FinishReason reason = FinishReason::none;
  double submitted = 0;    // engine clock, seconds
  double admitted = 0;     // first scheduled
  double first_token = 0;
  double finished = 0;
  std::vector<double> token_times;  // when each generated token was produced
  int64_t preemptions = 0;
  std::string error;  // why the request failed (reason == error)
  // The failure was the model's (logits not finite: an overflow), not the request's.
  bool model_fault = false;

  double queue_time() const { return admitted > 0 ? admitted - submitted : 0; }
  double ttft() const { return first_token > 0 ? first_token - submitted : 0; }
  std::vector<double> inter_token_times() const;
};

struct EngineStats {
  int64_t steps = 0;
  int64_t prefill_tokens = 0;  // prompt tokens computed (recomputation included)
  int64_t decode_tokens = 0;   // tokens generated
  int64_t preemptions = 0;
  int64_t waiting = 0;  // as of the last step, plus requests submitted since
  int64_t running = 0;
  int64_t peak_running = 0;  // most sequences in one step
  SpeculationStats speculation;  // zero unless the decoder speculates
  int64_t constrained_tokens = 0;  // tokens chosen under a request's constraint (structured output)
  double mask_seconds = 0;         // time the decoders spent on those tokens' masks
};

class Engine {
 public:
  explicit Engine(Pipeline& pipeline);
  ~Engine();

  // Throws Error for an empty prompt, a prompt that does not fit the context, or bad sampling values.
  RequestId submit(GenerationRequest request);
  void cancel(RequestId id);
  // Runs one step; false when there was nothing to do.
  bool step();
  // Steps until every submitted request has finished, for callers that submitted all of them first:
  // schedulers are told that nothing more arrives meanwhile (SchedulerView::arrivals_closed).
  void run_until_idle();
  std::vector<GenerationResult> take_finished();
  EngineStats stats() const;
  double now() const;

 private:
  struct Sequence;
  class Budget;
  void finish(Sequence& s, FinishReason reason);
  Sequence* find(RequestId id);
  void take_incoming();
  void decode(const std::vector<ForwardSeq>& batch, const std::vector<Sequence*>& batch_seqs);
  // Speculative decoding (engine_speculation.cpp).
  int64_t lookahead(const Sequence& s) const;
  void draft(std::vector<ForwardSeq>& batch, const std::vector<Sequence*>& batch_seqs, const Budget& budget);
  void settle_drafts(Sequence& s, const DecodeItem& item, int64_t tokens_before);

  Pipeline& pipeline_;
  Speculator* speculator_ = nullptr;  // the decoder's drafting side, if it has one
  std::chrono::steady_clock::time_point start_;
  // Shared with submitting threads (guarded by mutex_).
  mutable std::mutex mutex_;
  RequestId next_id_ = 1;
  std::vector<std::unique_ptr<Sequence>> incoming_;
  std::vector<RequestId> cancels_;
  std::vector<GenerationResult> finished_;
  EngineStats stats_;
  // Owned by the stepping thread.
  std::vector<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;
  std::vector<float> logits_;
  bool arrivals_closed_ = false;  // inside run_until_idle
};

}  // namespace tessera
