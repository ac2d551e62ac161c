// A request trace: the workload drawn into concrete requests (class, user, lengths, arrival time,
// prompt tokens). It is made once and every pipeline runs exactly this trace; the same workload,
// seed and tokenizer give the same trace.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/bench/workload.h"

namespace tessera {
class Tokenizer;
}

namespace tessera::bench {

struct TraceRequest {
  int64_t index = 0;
  int32_t klass = 0;            // index into Workload::classes
  int32_t user = 0;             // 0 .. users.count-1; named "user<N>"
  double arrival = 0;           // seconds after the start (poisson; 0 in a closed loop)
  int64_t system_tokens = 0;    // system prompt tokens this request carries
  int64_t prompt_tokens = 0;    // the request's own tokens (after BOS and the system prompt)
  int64_t output_tokens = 0;    // max_tokens
  bool clamped = false;         // cut to fit the model's context
  std::vector<int32_t> prompt;  // BOS + system prompt + own tokens
};

struct Trace {
  std::vector<TraceRequest> requests;
  int64_t context = 0;          // the context the trace was made for
  uint64_t fingerprint = 0;     // hash of every request (arrival, lengths, tokens)
  int64_t prompt_tokens = 0;    // totals over the trace
  int64_t output_tokens = 0;
  int64_t clamped = 0;
};

std::string user_name(int32_t user);

// Draws the trace. Token text comes from the workload's prompt file (tokenised, windows at seeded
// offsets) or from the vocabulary's normal tokens. Requests longer than `context` are clamped
// (ContextPolicy::clamp: the own prompt first, then the output) or rejected by check_context.
Trace make_trace(const Workload& w, const Tokenizer& tok, int64_t context);

}  // namespace tessera::bench
