#include "tessera/engine.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <string>
#include <thread>

#include "tessera/error.h"
#include "engine_sequence.h"

namespace tessera {

std::string_view finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::none: return "none";
    case FinishReason::eos: return "eos";
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::cancelled: return "cancelled";
    case FinishReason::error: return "error";
  }
  return "?";
}

std::vector<double> GenerationResult::inter_token_times() const {
  std::vector<double> out;
  for (size_t i = 1; i < token_times.size(); ++i) out.push_back(token_times[i] - token_times[i - 1]);
  return out;
}

Engine::Engine(Pipeline& pipeline)
    : pipeline_(pipeline), speculator_(pipeline.decoder().speculator()), start_(std::chrono::steady_clock::now()) {}

Engine::~Engine() {
  for (auto& s : running_) {
    pipeline_.cache().release(s->result.id);
    if (speculator_ != nullptr) speculator_->release(s->result.id);
  }
}

double Engine::now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

Engine::Sequence* Engine::find(RequestId id) {
  for (auto* list : {&running_, &waiting_}) {
    for (auto& s : *list) {
      if (s->result.id == id) return s.get();
    }
  }
  return nullptr;
}

RequestId Engine::submit(GenerationRequest request) {
  const ModelConfig& config = pipeline_.model().config();
  const auto n = static_cast<int64_t>(request.prompt.size());
  if (n == 0) throw Error("the prompt is empty");
  const int64_t limit = pipeline_.max_sequence_tokens();
  if (n >= limit) {
    throw Error("the prompt has " + std::to_string(n) + " tokens; " + pipeline_.sequence_limit_text() +
                " must also leave room for at least one generated token");
  }
  if (request.max_tokens < 0) throw Error("max_tokens must be >= 0, got " + std::to_string(request.max_tokens));
  for (int32_t t : request.prompt) {
    if (t < 0 || t >= config.vocab) {
      throw Error("prompt token id " + std::to_string(t) + " is outside the vocabulary (0.." +
                  std::to_string(config.vocab - 1) + ")");
    }
  }
  for (const std::string& stop : request.stop) {
    if (stop.empty()) throw Error("a stop string is empty; every stop string needs at least one character");
  }
  auto s = std::make_unique<Sequence>();
  s->text = TextStream(request.stop);
  s->sampling = request.sampling ? *request.sampling : pipeline_.decoder().default_params();
  validate_sampling(s->sampling);
  s->rng = s->sampling.seed;
  s->result.prompt = request.prompt;
  s->tokens = request.prompt;
  s->max_total = std::min(limit, n + request.max_tokens);
  if (request.constraint != nullptr) s->constraint = request.constraint->start();
  s->request = std::move(request);

  std::lock_guard lock(mutex_);
  const RequestId id = next_id_++;
  s->result.id = id;
  s->result.submitted = now();
  incoming_.push_back(std::move(s));
  return id;
}

void Engine::cancel(RequestId id) {
  std::lock_guard lock(mutex_);
  cancels_.push_back(id);
}

void Engine::finish(Sequence& s, FinishReason reason) {
  pipeline_.cache().release(s.result.id);
  if (speculator_ != nullptr) speculator_->release(s.result.id);
  const std::string_view rest = s.text.take_rest();
  if (s.request.on_text && !rest.empty()) s.request.on_text(s.result.id, rest);
  s.result.text = s.text.text();
  s.done = true;
  s.result.reason = reason;
  s.result.finished = now();
  std::lock_guard lock(mutex_);
  finished_.push_back(std::move(s.result));
}

void Engine::take_incoming() {
  std::vector<std::unique_ptr<Sequence>> incoming;
  std::vector<RequestId> cancels;
  {
    std::lock_guard lock(mutex_);
    incoming.swap(incoming_);
    cancels.swap(cancels_);
  }
  for (auto& s : incoming) waiting_.push_back(std::move(s));
  for (RequestId id : cancels) {
    if (Sequence* s = find(id)) finish(*s, FinishReason::cancelled);
  }
  // Requests with nothing to generate end here.
  for (auto& s : waiting_) {
    if (!s->done && int64_t(s->tokens.size()) >= s->max_total) finish(*s, FinishReason::length);
  }
  for (auto* list : {&running_, &waiting_}) std::erase_if(*list, [](const auto& s) { return s->done; });
}

bool Engine::step() {
  // Pipelines sharing weights (PipelineOptions::share) run one step at a time on them.
  std::lock_guard running(pipeline_.step_mutex());
  const double step_start = now();
  take_incoming();
  if (running_.empty() && waiting_.empty()) return false;

  std::vector<SequenceInfo> waiting_info, running_info;
  for (auto& s : waiting_) waiting_info.push_back(s->info());
  for (auto& s : running_) running_info.push_back(s->info());
  SchedulerView view{waiting_info, running_info, pipeline_.max_sequence_tokens(), now(), arrivals_closed_};
  Cache& cache = pipeline_.cache();
  Budget budget(cache, *this);
  StepPlan plan = pipeline_.scheduler().schedule(view, budget);
  // Releasing a running sequence's cache frees the KV it still needs: only a preemption may.
  for (const SeqId id : budget.released()) {
    const bool running = std::any_of(running_.begin(), running_.end(), [&](const auto& r) { return r->result.id == id; });
    if (running && std::find(plan.preempted.begin(), plan.preempted.end(), id) == plan.preempted.end()) {
      throw Error("scheduler '" + pipeline_.spec().components.at(ComponentKind::scheduler).plugin +
                  "' released the cache of running request " + std::to_string(id) +
                  " without listing it as preempted (its KV would be lost)");
    }
  }

  // Preempted sequences go back to the front of the queue and will recompute their KV.
  for (auto id = plan.preempted.rbegin(); id != plan.preempted.rend(); ++id) {
    auto it = std::find_if(running_.begin(), running_.end(), [&](const auto& s) { return s->result.id == *id; });
    if (it == running_.end()) continue;
    (*it)->computed = 0;
    if (speculator_ != nullptr) speculator_->release(*id);
    ++(*it)->result.preemptions;
    {
      std::lock_guard lock(mutex_);
      ++stats_.preemptions;
    }
    waiting_.insert(waiting_.begin(), std::move(*it));
    running_.erase(it);
  }
  if (plan.work.empty()) {
    if (running_.empty() && !waiting_.empty()) {
      if (plan.retry_after > 0) {
        // The scheduler is waiting on purpose (a batch filling up): don't spin.
        std::this_thread::sleep_for(std::chrono::duration<double>(std::min(plan.retry_after, 0.005)));
      } else {
        // Nothing runs and nothing was admitted: even an empty cache cannot hold the request the
        // scheduler tried to place (else, having tried none, the oldest). Fail that request alone;
        // the others go on.
        const std::optional<SeqId> refused = budget.first_refused();
        auto it = std::find_if(waiting_.begin(), waiting_.end(),
                               [&](const auto& w) { return refused && w->result.id == *refused; });
        if (it == waiting_.end()) it = waiting_.begin();
        Sequence& s = **it;
        const CacheStats cs = cache.stats();
        auto count = [](int64_t n, const char* what) {
          return std::to_string(n) + " " + what + (n == 1 ? "" : "s");
        };
        const auto prompt = int64_t(s.request.prompt.size()), held = int64_t(s.tokens.size());
        // A prompt larger than the whole pool fits whatever the scheduler keeps in reserve.
        const bool prompt_fits = prompt <= cs.blocks_total * cs.block_size;
        s.result.error = "the KV cache cannot hold this request (" + count(prompt, "prompt token") +
                         (held > prompt ? " and " + std::to_string(held - prompt) + " generated" : "") +
                         ", up to " + std::to_string(s.max_total) + " with the tokens to generate) in " +
                         count(cs.blocks_total, "block") + " of " + count(cs.block_size, "token") +
                         "; give the cache more memory, " +
                         (prompt_fits ? "ask for fewer tokens, or lower the scheduler's admission_reserve"
                                      : "or send a shorter prompt");
        finish(s, FinishReason::error);
        waiting_.erase(it);
      }
    }
    std::lock_guard lock(mutex_);
    stats_.waiting = static_cast<int64_t>(waiting_.size());
    stats_.running = static_cast<int64_t>(running_.size());
    return !running_.empty() || !waiting_.empty();
  }
  if (!budget.plan()) {
    throw Error("scheduler '" + pipeline_.spec().components.at(ComponentKind::scheduler).plugin +
                "' scheduled work without reserving cache space");
  }
  cache.commit(*budget.plan());
  for (const CacheGrant& g : budget.plan()->grants) {
    // Prefix reuse: KV already present need not be computed (the last token always is, for logits).
    if (Sequence* s = find(g.seq)) {
      const int64_t reused = std::min<int64_t>(g.cached_tokens, int64_t(s->tokens.size()) - 1);
      if (reused > s->computed) {
        s->computed = reused;
        // Usage counts the prompt tokens found at admission (as vLLM's cached_tokens); a preempted
        // sequence finding its own blocks again saves recomputation, not prompt work.
        if (s->result.preemptions == 0) {
          s->result.cached_tokens = std::max(s->result.cached_tokens,
                                             std::min<int64_t>(reused, int64_t(s->request.prompt.size())));
        }
      }
    }
  }

  // Admit newly scheduled sequences, then build the batch in plan order.
  const double t = now();
  std::vector<ForwardSeq> batch;
  std::vector<Sequence*> batch_seqs;
  for (const ScheduledWork& w : plan.work) {
    auto it = std::find_if(waiting_.begin(), waiting_.end(), [&](const auto& s) { return s->result.id == w.id; });
    if (it != waiting_.end()) {
      if ((*it)->result.admitted == 0) (*it)->result.admitted = t;
      running_.push_back(std::move(*it));
      waiting_.erase(it);
    }
    Sequence* s = find(w.id);
    if (s == nullptr || w.n_tokens <= 0) continue;
    // A prefix hit moves `computed` past what the scheduler counted on: never compute beyond the
    // blocks the sequence holds (the rest follows next step).
    const int64_t held = int64_t(cache.block_table(w.id).size()) * cache.layer(0).block_size;
    const int64_t end = std::min({int64_t(s->tokens.size()), s->computed + w.n_tokens, held});
    if (end <= s->computed) continue;
    ForwardSeq fs;
    fs.seq = w.id;
    fs.tokens = std::span<const int32_t>(s->tokens).subspan(size_t(s->computed), size_t(end - s->computed));
    fs.start_pos = s->computed;
    fs.logit_rows = end == int64_t(s->tokens.size()) ? 1 : 0;
    batch.push_back(fs);
    batch_seqs.push_back(s);
  }
  draft(batch, batch_seqs, budget);
  pipeline_.model().forward(batch, pipeline_.attention(), cache, logits_);
  decode(batch, batch_seqs);
  // Rejected drafts and look-ahead room go back to the cache (what the scheduler reserved stays).
  for (Sequence* s : batch_seqs) {
    const SeqId id = s->result.id;
    if (!s->done && budget.lookahead(id) > 0) cache.truncate(id, std::max(s->computed, budget.requested(id)));
  }
  std::lock_guard lock(mutex_);
  if (speculator_ != nullptr) stats_.speculation.step_seconds += now() - step_start;
  stats_.peak_running = std::max(stats_.peak_running, static_cast<int64_t>(running_.size()));
  std::erase_if(running_, [](const auto& s) { return s->done; });
  stats_.waiting = static_cast<int64_t>(waiting_.size());
  stats_.running = static_cast<int64_t>(running_.size());
  return true;
}

void Engine::decode(const std::vector<ForwardSeq>& batch, const std::vector<Sequence*>& batch_seqs) {
  Cache& cache = pipeline_.cache();
  std::vector<DecodeItem> items;
  std::vector<Sequence*> item_seqs;
  size_t row = 0;
  int64_t prefill = 0;
  const int64_t vocab = pipeline_.model().config().vocab;
  for (size_t i = 0; i < batch.size(); ++i) {
    Sequence* s = batch_seqs[i];
    const int64_t n = int64_t(batch[i].tokens.size());
    prefill += std::max<int64_t>(0, std::min<int64_t>(n, int64_t(s->request.prompt.size()) - s->computed));
    // With drafts, how much KV stays is known only after verification (settle_drafts).
    if (s->draft.empty()) {
      s->computed += n;
      cache.mark_computed(s->result.id, s->computed);
    }
    if (batch[i].logit_rows == 0) continue;
    DecodeItem item;
    item.seq = s->result.id;
    item.logits = logits_.data() + row * size_t(vocab);
    item.vocab = vocab;
    item.params = s->sampling;
    item.history = s->tokens;
    item.prompt_tokens = int64_t(s->request.prompt.size());
    item.draft = s->draft;
    item.rng_state = &s->rng;
    item.constraint = s->constraint.get();
    item.tokens_left = s->max_total - int64_t(s->tokens.size());
    items.push_back(std::move(item));
    item_seqs.push_back(s);
    row += size_t(batch[i].logit_rows);
  }
  pipeline_.decoder().select(items);

  // What a decoder may return (decoder.h): one token for a plain step; for a verification the
  // accepted leading drafts and one more; ids inside the vocabulary. A decoder that breaks this
  // fails the request, naming itself, rather than the output going wrong without a word.
  auto contract_error = [&](const DecodeItem& item) -> std::string {
    const size_t n = item.tokens.size(), drafts = item.draft.size();
    if (n == 0 || n > drafts + 1) {
      return "returned " + std::to_string(n) + " tokens for a step with " + std::to_string(drafts) +
             " drafts (1 to " + std::to_string(drafts + 1) + " expected)";
    }
    for (size_t k = 0; k < n; ++k) {
      if (item.tokens[k] < 0 || item.tokens[k] >= vocab) {
        return "returned token id " + std::to_string(item.tokens[k]) + ", outside the vocabulary (0.." +
               std::to_string(vocab - 1) + ")";
      }
      if (k + 1 < n && item.tokens[k] != item.draft[k]) {
        return "returned token " + std::to_string(item.tokens[k]) + " as accepted draft " + std::to_string(k) +
               ", which was " + std::to_string(item.draft[k]);
      }
    }
    return "";
  };

  const Tokenizer& tokenizer = pipeline_.tokenizer();
  const int32_t eos = tokenizer.eos();
  const double t = now();
  int64_t generated = 0, constrained = 0;
  double mask_seconds = 0;
  for (const DecodeItem& item : items) {
    if (item.constraint == nullptr) continue;
    constrained += int64_t(item.tokens.size());
    mask_seconds += item.mask_seconds;
  }
  for (size_t i = 0; i < items.size(); ++i) {
    Sequence* s = item_seqs[i];
    const DecodeItem& item = items[i];
    const auto tokens_before = int64_t(s->tokens.size());
    if (const std::string broken = contract_error(item); !broken.empty()) {
      s->result.error = "decoder '" + pipeline_.spec().components.at(ComponentKind::decoder).plugin + "' " + broken;
      s->result.model_fault = true;  // the server's fault, not the request's
      finish(*s, FinishReason::error);
      continue;
    }
    // An overflow upstream (weights, or activations past f16's range in an f16 KV cache) makes the
    // logits NaN or infinite, and any token "chosen" from them is noise: fail the request, naming
    // the cause. Each token's chosen logit is checked (row k for token k of a speculative step): a
    // NaN row gives a NaN choice.
    size_t bad = item.tokens.size();
    for (size_t k = 0; k < item.tokens.size() && bad == item.tokens.size(); ++k) {
      const int32_t tok = item.tokens[k];
      if (!std::isfinite(item.logits[k * size_t(vocab) + size_t(tok)])) bad = k;
    }
    if (bad < item.tokens.size()) {
      s->result.error = "the model's logits are not finite (NaN or infinity) at generated token " +
                        std::to_string(s->result.tokens.size() + bad + 1) + ": its weights or activations overflow" +
                        (pipeline_.spec().kv_dtype == DType::F16
                             ? " (the f16 KV cache holds values up to 65504: try kv_dtype f32 or bf16)"
                             : "");
      s->result.model_fault = true;
      finish(*s, FinishReason::error);
      continue;
    }
    if (item.constraint_dead_end) {
      // The grammar wants bytes that no token of this vocabulary spells (or the decoder returned a
      // token outside the mask): fail rather than emit output that breaks the constraint.
      s->result.error = "the output constraint allows no token of this vocabulary after " +
                        std::to_string(s->result.tokens.size()) + " generated tokens";
      finish(*s, FinishReason::error);
      continue;
    }
    FinishReason reason = FinishReason::none;
    for (size_t k = 0; k < item.tokens.size(); ++k) {
      const int32_t tok = item.tokens[k];
      s->tokens.push_back(tok);
      s->result.tokens.push_back(tok);
      s->result.token_times.push_back(t);
      if (k < item.logprobs.size()) s->result.logprobs.push_back(item.logprobs[k]);
      if (k < item.top_logprobs.size()) s->result.top_logprobs.push_back(item.top_logprobs[k]);
      ++generated;
      if (s->result.first_token == 0) s->result.first_token = t;
      if (s->request.on_token) s->request.on_token(s->result.id, tok);
      const auto& stops = s->request.stop_tokens;
      const bool eos_hit = !s->request.ignore_eos && tok == eos;
      // The end token adds no text; a caller's stop token does (as the model's output).
      if (!eos_hit && s->text.append(tokenizer.token_to_piece(tok))) {
        reason = FinishReason::stop;
      } else if (eos_hit) {
        reason = FinishReason::eos;
      } else if (std::find(stops.begin(), stops.end(), tok) != stops.end()) {
        reason = FinishReason::stop;
      } else if (s->constraint != nullptr && k + 1 == item.tokens.size() && s->constraint->finished()) {
        reason = FinishReason::stop;  // the constraint is complete: nothing but an end may follow
      } else if (int64_t(s->tokens.size()) >= s->max_total) {
        reason = FinishReason::length;
      }
      if (reason != FinishReason::none) break;
    }
    if (!item.draft.empty()) settle_drafts(*s, item, tokens_before);
    if (reason == FinishReason::none && s->request.on_text) {
      const std::string_view ready = s->text.take_ready();
      if (!ready.empty()) s->request.on_text(s->result.id, ready);
    }
    if (reason != FinishReason::none) finish(*s, reason);
  }
  std::lock_guard lock(mutex_);
  ++stats_.steps;
  stats_.prefill_tokens += prefill;
  stats_.decode_tokens += generated;
  stats_.constrained_tokens += constrained;
  stats_.mask_seconds += mask_seconds;
}

void Engine::run_until_idle() {
  arrivals_closed_ = true;
  struct Reopen {
    bool& closed;
    ~Reopen() { closed = false; }
  } reopen{arrivals_closed_};  // on return and on a throw
  while (step()) {
  }
}

std::vector<GenerationResult> Engine::take_finished() {
  std::lock_guard lock(mutex_);
  std::vector<GenerationResult> out;
  out.swap(finished_);
  return out;
}

EngineStats Engine::stats() const {
  std::lock_guard lock(mutex_);
  EngineStats s = stats_;
  s.waiting += static_cast<int64_t>(incoming_.size());
  return s;
}

}  // namespace tessera
