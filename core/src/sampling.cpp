#include "tessera/sampling.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <unordered_map>
#include <unordered_set>

#ifdef __SSE2__
#include <emmintrin.h>
#endif

namespace tessera {

std::vector<ParamSpec> sampling_param_specs() {
  return {{"temperature", ParamType::number, 0.0, "0 = greedy", {}},
          {"top_k", ParamType::integer, 0, "keep the k most likely tokens; 0 = off", {}},
          {"top_p", ParamType::number, 1.0, "nucleus: smallest set with this probability mass", {}},
          {"min_p", ParamType::number, 0.0, "drop tokens below min_p x the top probability", {}},
          {"repetition_penalty", ParamType::number, 1.0,
           "divide positive (multiply negative) logits of tokens in prompt or output (1 = off)", {}},
          {"frequency_penalty", ParamType::number, 0.0,
           "subtract this x the count of each token generated so far (-2..2; 0 = off)", {}},
          {"presence_penalty", ParamType::number, 0.0,
           "subtract this once from each token generated so far (-2..2; 0 = off)", {}},
          {"seed", ParamType::integer, 0, "default random seed for requests that give none", {}}};
}

SamplingParams sampling_params_from(const Params& p) {
  SamplingParams s;
  s.temperature = p.get_float("temperature");
  s.top_k = p.get_int("top_k");
  s.top_p = p.get_float("top_p");
  s.min_p = p.get_float("min_p");
  s.repetition_penalty = p.get_float("repetition_penalty");
  s.frequency_penalty = p.get_float("frequency_penalty");
  s.presence_penalty = p.get_float("presence_penalty");
  s.seed = static_cast<uint64_t>(p.get_int("seed"));
  validate_sampling(s);
  return s;
}

uint64_t next_random(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double uniform01(uint64_t& state) { return double(next_random(state) >> 11) * (1.0 / 9007199254740992.0); }

bool has_penalties(const SamplingParams& p) {
  return p.repetition_penalty != 1.0 || p.frequency_penalty != 0.0 || p.presence_penalty != 0.0;
}

void apply_penalties(const SamplingParams& p, std::span<const int32_t> history, int64_t prompt_tokens,
                     std::span<float> logits) {
  const auto vocab = static_cast<int64_t>(logits.size());
  auto inside = [&](int32_t t) { return t >= 0 && t < vocab; };
  if (p.repetition_penalty != 1.0) {
    std::unordered_set<int32_t> seen(history.begin(), history.end());
    const auto r = float(p.repetition_penalty);
    for (int32_t t : seen) {
      if (!inside(t)) continue;
      float& l = logits[size_t(t)];
      l = l > 0 ? l / r : l * r;
    }
  }
  if (p.frequency_penalty != 0.0 || p.presence_penalty != 0.0) {
    const size_t from = size_t(std::clamp<int64_t>(prompt_tokens, 0, int64_t(history.size())));
    std::unordered_map<int32_t, int64_t> counts;
    for (size_t i = from; i < history.size(); ++i) ++counts[history[i]];
    for (const auto& [t, n] : counts) {
      if (!inside(t)) continue;
      logits[size_t(t)] -= float(double(n) * p.frequency_penalty + p.presence_penalty);
    }
  }
}

int32_t argmax(const float* logits, int64_t vocab) {
#ifdef __SSE2__
  // std::max_element's answer (the first maximum; NaNs lose to everything after a non-NaN first
  // element) in two vector passes: greedy decoding runs this on every step, and the scalar scan of a
  // 32000-token vocabulary took ~20 us, a half per cent of a small model's step.
  if (vocab <= 0 || std::isnan(logits[0])) return 0;
  const int64_t v4 = vocab / 4 * 4;
  // maxps returns its second operand when the first is NaN, so NaNs never reach the running maximum.
  __m128 a = _mm_set1_ps(logits[0]), b = a;
  int64_t i = 0;
  for (; i + 8 <= v4; i += 8) {
    a = _mm_max_ps(_mm_loadu_ps(logits + i), a);
    b = _mm_max_ps(_mm_loadu_ps(logits + i + 4), b);
  }
  if (i < v4) a = _mm_max_ps(_mm_loadu_ps(logits + i), a);
  alignas(16) float lanes[8];
  _mm_store_ps(lanes, a);
  _mm_store_ps(lanes + 4, b);
  float best = lanes[0];
  for (const float l : lanes) best = l > best ? l : best;
  for (int64_t t = v4; t < vocab; ++t) best = logits[t] > best ? logits[t] : best;
  const __m128 target = _mm_set1_ps(best);
  for (i = 0; i < v4; i += 4) {
    if (const int mask = _mm_movemask_ps(_mm_cmpeq_ps(_mm_loadu_ps(logits + i), target)); mask != 0) {
      return static_cast<int32_t>(i + __builtin_ctz(unsigned(mask)));
    }
  }
  for (; i < vocab; ++i) {
    if (logits[i] == best) return static_cast<int32_t>(i);
  }
  return 0;
#else
  return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
#endif
}

void sampling_distribution(const SamplingParams& p, const float* logits, int64_t vocab,
                           std::vector<Candidate>& out) {
  out.clear();
  if (vocab <= 0) return;
  if (p.temperature == 0.0) {
    out.push_back({argmax(logits, vocab), 1.0});
    return;
  }
  // Candidates by decreasing logit (ties: lower id first, so the order is deterministic), cut by
  // top-k, then softmax at the temperature, then min-p and top-p on the sorted probabilities.
  out.resize(size_t(vocab));
  for (int64_t i = 0; i < vocab; ++i) out[size_t(i)] = {int32_t(i), double(logits[i])};
  auto before = [](const Candidate& a, const Candidate& b) { return a.p > b.p || (a.p == b.p && a.token < b.token); };
  int64_t keep = vocab;
  if (p.top_k > 0) keep = std::min(keep, p.top_k);
  std::partial_sort(out.begin(), out.begin() + keep, out.end(), before);
  out.resize(size_t(keep));
  const double top = out[0].p;
  double sum = 0;
  for (Candidate& c : out) {
    c.p = std::exp((c.p - top) / p.temperature);
    sum += c.p;
  }
  for (Candidate& c : out) c.p /= sum;
  size_t n = out.size();
  if (p.min_p > 0) {
    const double floor = p.min_p * out[0].p;
    while (n > 1 && out[n - 1].p < floor) --n;
  }
  if (p.top_p < 1.0) {
    double cum = 0;
    size_t i = 0;
    for (; i < n; ++i) {
      cum += out[i].p;
      if (cum >= p.top_p) break;
    }
    n = std::min(n, i + 1);
  }
  out.resize(n);
  double mass = 0;
  for (const Candidate& c : out) mass += c.p;
  for (Candidate& c : out) c.p /= mass;
}

int32_t draw(std::span<const Candidate> dist, uint64_t& rng) {
  double mass = 0;
  for (const Candidate& c : dist) mass += c.p;
  double r = uniform01(rng) * mass;
  for (const Candidate& c : dist) {
    r -= c.p;
    if (r < 0) return c.token;
  }
  // Rounding left a sliver: the last token with probability above zero.
  for (auto it = dist.rbegin(); it != dist.rend(); ++it) {
    if (it->p > 0) return it->token;
  }
  return dist.empty() ? 0 : dist.front().token;
}

namespace {

double mass_of(std::span<const Candidate> dist, int32_t token) {
  for (const Candidate& c : dist) {
    if (c.token == token) return c.p;
  }
  return 0.0;
}

}  // namespace

DraftVerdict accept_or_resample(std::span<const Candidate> p, std::span<const Candidate> q, int32_t x, uint64_t& rng,
                                std::vector<Candidate>& scratch) {
  const bool point = q.empty();
  const double px = mass_of(p, x);
  const double qx = point ? 1.0 : mass_of(q, x);
  if (qx > 0 && uniform01(rng) * qx < px) return {x, true};
  scratch.clear();
  for (const Candidate& c : p) {
    const double r = c.p - (point ? (c.token == x ? 1.0 : 0.0) : mass_of(q, c.token));
    if (r > 0) scratch.push_back({c.token, r});
  }
  // p == q leaves nothing (and cannot reject); rounding aside, fall back to p itself.
  return {draw(scratch.empty() ? p : std::span<const Candidate>(scratch), rng), false};
}

void token_logprobs(const float* logits, int64_t vocab, int32_t chosen, int64_t top_n, float* chosen_logprob,
                    std::vector<TokenLogprob>* top) {
  const float mx = *std::max_element(logits, logits + vocab);
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(double(logits[i]) - mx);
  const double lse = double(mx) + std::log(sum);
  if (chosen_logprob != nullptr) *chosen_logprob = float(double(logits[chosen]) - lse);
  if (top == nullptr) return;
  top->clear();
  if (top_n <= 0) return;
  const int64_t n = std::min(top_n, vocab);
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) ids[size_t(i)] = int32_t(i);
  std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  for (int64_t i = 0; i < n; ++i) top->push_back({ids[size_t(i)], float(double(logits[ids[size_t(i)]]) - lse)});
}

const float* TokenSampler::penalized(const SamplingParams& p, const float* logits, int64_t vocab,
                                     std::span<const int32_t> history, int64_t prompt_tokens) {
  if (!has_penalties(p) || history.empty()) return logits;
  penalized_.assign(logits, logits + vocab);
  apply_penalties(p, history, prompt_tokens, penalized_);
  return penalized_.data();
}

int32_t TokenSampler::pick(const SamplingParams& p, const float* logits, int64_t vocab,
                           std::span<const int32_t> history, int64_t prompt_tokens, uint64_t& rng) {
  const float* l = penalized(p, logits, vocab, history, prompt_tokens);
  if (p.temperature == 0.0) return argmax(l, vocab);
  sampling_distribution(p, l, vocab, dist_);
  return draw(dist_, rng);
}

void TokenSampler::record(DecodeItem& item, const float* logits, int32_t token) {
  // A log-softmax over the whole vocabulary per token: a visible share of decode on large
  // vocabularies, so only when asked for.
  if (item.params.logprobs < 0) {
    item.tokens.push_back(token);
    return;
  }
  float lp = 0;
  std::vector<TokenLogprob> top;
  token_logprobs(logits, item.vocab, token, item.params.logprobs, &lp, item.params.logprobs > 0 ? &top : nullptr);
  item.tokens.push_back(token);
  item.logprobs.push_back(lp);
  if (item.params.logprobs > 0) {
    item.top_logprobs.resize(item.tokens.size() - 1);
    item.top_logprobs.push_back(std::move(top));
  }
}

const float* TokenSampler::constrained(DecodeItem& item, const float* logits, int64_t tokens_left) {
  if (item.constraint == nullptr) return logits;
  const auto start = std::chrono::steady_clock::now();
  struct Timer {
    DecodeItem& item;
    std::chrono::steady_clock::time_point start;
    ~Timer() { item.mask_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); }
  } timer{item, start};
  mask_.resize(mask_words(item.vocab));
  item.constraint->fill_mask(mask_, tokens_left);
  masked_.assign(logits, logits + item.vocab);
  constexpr float kNone = -std::numeric_limits<float>::infinity();
  bool any = false;
  // Word by word: inside a string most words are all allowed, elsewhere most are all refused.
  for (size_t w = 0; w < mask_.size(); ++w) {
    const uint32_t bits = mask_[w];
    const size_t first = w * 32, last = std::min<size_t>(first + 32, size_t(item.vocab));
    if (bits == 0xFFFFFFFFu && last - first == 32) {
      any = true;
    } else if (bits == 0) {
      std::fill(masked_.begin() + long(first), masked_.begin() + long(last), kNone);
    } else {
      for (size_t t = first; t < last; ++t) {
        if ((bits >> (t - first)) & 1u) any = true;
        else masked_[t] = kNone;
      }
    }
  }
  if (!any) item.constraint_dead_end = true;
  return masked_.data();
}

void TokenSampler::advance(DecodeItem& item, int32_t token) {
  if (item.constraint != nullptr && !item.constraint->accept(token)) item.constraint_dead_end = true;
}

void TokenSampler::select_one(DecodeItem& item) {
  uint64_t local = item.params.seed;
  uint64_t& rng = item.rng_state != nullptr ? *item.rng_state : local;
  int32_t t = 0;
  if (item.constraint == nullptr) {
    t = pick(item.params, item.logits, item.vocab, item.history, item.prompt_tokens, rng);
  } else {
    const float* l = penalized(item.params, item.logits, item.vocab, item.history, item.prompt_tokens);
    l = constrained(item, l, item.tokens_left);
    if (item.params.temperature == 0.0) {
      t = argmax(l, item.vocab);
    } else {
      sampling_distribution(item.params, l, item.vocab, dist_);
      t = draw(dist_, rng);
    }
    advance(item, t);
  }
  record(item, item.logits, t);
}

}  // namespace tessera
