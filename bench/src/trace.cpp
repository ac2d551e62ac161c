#include "tessera/bench/trace.h"

#include <algorithm>
#include <cmath>

#include "tessera/bench/rng.h"
#include "tessera/error.h"
#include "tessera/read_file.h"
#include "tessera/tokenizer.h"

namespace tessera::bench {

std::string user_name(int32_t user) { return "user" + std::to_string(user); }

namespace {

// Where prompt tokens come from: a long token stream, read in windows.
class TextSource {
 public:
  TextSource(const Workload& w, const Tokenizer& tok) {
    if (w.prompts.from_file) {
      try {
        stream_ = tok.encode(read_file(w.prompts.path, "prompt text file", kTextInputLimits), false);
      } catch (const Error& e) {
        throw Error(w.path + ": " + e.what());
      }
      if (stream_.size() < 16) {
        throw Error(w.path + ": the prompt text file " + w.prompts.path + " has only " +
                    std::to_string(stream_.size()) + " tokens");
      }
    } else {
      // Normal tokens only: no control, byte or unknown tokens, which no real text is made of.
      const Vocabulary& v = tok.vocabulary();
      for (int32_t id = 0; id < tok.vocab_size(); ++id) {
        const int32_t type = v.types.empty() ? kTokenNormal : v.types[size_t(id)];
        if (type == kTokenNormal && id != v.bos && id != v.eos && id != v.unk && id != v.pad) vocab_.push_back(id);
      }
      if (vocab_.empty()) throw Error(w.path + ": the model's vocabulary has no normal tokens to make prompts from");
    }
  }

  void append(std::vector<int32_t>& out, int64_t n, Rng& rng) const {
    if (!stream_.empty()) {
      size_t pos = size_t(rng.uniform_int(0, int64_t(stream_.size()) - 1));
      for (int64_t i = 0; i < n; ++i) {
        out.push_back(stream_[pos]);
        pos = (pos + 1) % stream_.size();  // a file shorter than the prompt wraps around
      }
    } else {
      for (int64_t i = 0; i < n; ++i) out.push_back(vocab_[size_t(rng.uniform_int(0, int64_t(vocab_.size()) - 1))]);
    }
  }

 private:
  std::vector<int32_t> stream_;
  std::vector<int32_t> vocab_;
};

int32_t pick_weighted(const std::vector<double>& cumulative, Rng& rng) {
  const double u = rng.uniform() * cumulative.back();
  const auto it = std::upper_bound(cumulative.begin(), cumulative.end(), u);
  return int32_t(std::min<size_t>(size_t(it - cumulative.begin()), cumulative.size() - 1));
}

uint64_t mix(uint64_t h, uint64_t v) { return (h ^ v) * 0x100000001b3ull + (h >> 29); }

}  // namespace

Trace make_trace(const Workload& w, const Tokenizer& tok, int64_t context) {
  check_context(w, context, "the model");  // throws for ContextPolicy::reject
  const TextSource text(w, tok);

  std::vector<double> class_cdf, user_cdf;
  for (const auto& c : w.classes) class_cdf.push_back((class_cdf.empty() ? 0 : class_cdf.back()) + c.weight);
  for (int64_t u = 0; u < w.users.count; ++u) {
    const double weight = w.users.zipf ? 1.0 / std::pow(double(u + 1), w.users.s) : 1.0;
    user_cdf.push_back((user_cdf.empty() ? 0 : user_cdf.back()) + weight);
  }

  // System prompts: one shared, one per user or one per class, each its own seeded text.
  const int64_t n_system = w.system.scope == SystemPrompt::Scope::user    ? w.users.count
                           : w.system.scope == SystemPrompt::Scope::klass ? int64_t(w.classes.size())
                                                                          : 1;
  std::vector<std::vector<int32_t>> system_prompts(static_cast<size_t>(n_system));
  for (int64_t i = 0; i < n_system && w.system.length > 0; ++i) {
    Rng rng(w.seed, "system" + std::to_string(i));
    text.append(system_prompts[size_t(i)], w.system.length, rng);
  }

  Rng classes(w.seed, "class"), users(w.seed, "user"), lengths(w.seed, "length"), arrivals(w.seed, "arrival"),
      shares(w.seed, "system_share"), content(w.seed, "content");
  Trace t;
  t.context = context;
  double clock = 0;
  uint64_t h = 0xcbf29ce484222325ull;
  for (int64_t i = 0; i < w.requests; ++i) {
    TraceRequest r;
    r.index = i;
    r.klass = pick_weighted(class_cdf, classes);
    r.user = pick_weighted(user_cdf, users);
    const RequestClass& c = w.classes[size_t(r.klass)];
    r.prompt_tokens = c.prompt.sample(lengths);
    r.output_tokens = c.output.sample(lengths);
    if (w.arrival.process == Arrival::Process::poisson) r.arrival = clock += arrivals.exponential(w.arrival.rate);
    const bool has_system = w.system.length > 0 && shares.uniform() < w.system.share;
    const size_t which = w.system.scope == SystemPrompt::Scope::user    ? size_t(r.user)
                         : w.system.scope == SystemPrompt::Scope::klass ? size_t(r.klass)
                                                                        : 0;
    r.system_tokens = has_system ? w.system.length : 0;
    // Clamp: the own prompt gives way first (down to one token), then the output.
    const int64_t room = context - 1 - r.system_tokens;
    if (r.prompt_tokens + r.output_tokens > room) {
      r.clamped = true;
      r.prompt_tokens = std::max<int64_t>(1, std::min(r.prompt_tokens, room - r.output_tokens));
      r.output_tokens = std::max<int64_t>(1, room - r.prompt_tokens);
      ++t.clamped;
    }
    r.prompt.reserve(size_t(1 + r.system_tokens + r.prompt_tokens));
    r.prompt.push_back(tok.bos());
    if (has_system) r.prompt.insert(r.prompt.end(), system_prompts[which].begin(), system_prompts[which].end());
    text.append(r.prompt, r.prompt_tokens, content);

    h = mix(h, uint64_t(r.klass));
    h = mix(h, uint64_t(r.user));
    h = mix(h, uint64_t(std::llround(r.arrival * 1e6)));
    h = mix(h, uint64_t(r.output_tokens));
    for (int32_t id : r.prompt) h = mix(h, uint64_t(id));
    t.prompt_tokens += int64_t(r.prompt.size());
    t.output_tokens += r.output_tokens;
    t.requests.push_back(std::move(r));
  }
  t.fingerprint = h;
  return t;
}

}  // namespace tessera::bench
