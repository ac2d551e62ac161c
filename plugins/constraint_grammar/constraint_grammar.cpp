// constraint: grammar — JSON mode, JSON Schema, GBNF grammars, regular expressions and fixed
// choices, all compiled to one byte-level grammar and matched with parse stacks. Token masks are
// cached per grammar state (the stacks' canonical key): inside a string or a repeated structure the
// same state recurs, so most steps copy a cached mask; a new state walks the vocabulary trie once.
// Compiled grammars are cached by (type, text), so a server that sees one schema on every request
// compiles it, and fills its masks, once.
#include <list>
#include <map>
#include <mutex>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "gbnf_text.h"
#include "grammar.h"
#include "grammar_matcher.h"
#include "json_schema_gbnf.h"
#include "regex_gbnf.h"
#include "tessera/constraint.h"
#include "tessera/plugin.h"
#include "token_mask.h"

namespace tessera {
namespace {

using grammar::Grammar;
using grammar::Stacks;
using grammar::TokenTrie;

// End tokens spell nothing: an end token whose text is "<|endoftext|>" must not pass as that text.
ConstraintVocab without_end_pieces(ConstraintVocab v) {
  std::erase_if(v.end_tokens, [&](int32_t t) { return t < 0 || size_t(t) >= v.pieces.size(); });
  for (int32_t t : v.end_tokens) v.pieces[size_t(t)].clear();
  return v;
}

struct VocabData {
  explicit VocabData(ConstraintVocab given)
      : VocabData(without_end_pieces(std::move(given)), 0) {}
  VocabData(ConstraintVocab v, int) : pieces(std::move(v.pieces)), trie(pieces), is_end(pieces.size(), false) {
    for (int32_t t : v.end_tokens) is_end[size_t(t)] = true;
    end_tokens = std::move(v.end_tokens);
  }
  std::vector<std::string> pieces;
  TokenTrie trie;
  std::vector<bool> is_end;
  std::vector<int32_t> end_tokens;
};

struct CachedMask {
  std::vector<uint32_t> mask;
  uint64_t max_distance = 0;  // bytes to an end after the farthest allowed token
};

class GrammarProgram final : public CompiledConstraint, public std::enable_shared_from_this<GrammarProgram> {
 public:
  GrammarProgram(Grammar g, std::shared_ptr<const VocabData> vocab, size_t cache_bytes)
      : grammar_(std::move(g)), vocab_(std::move(vocab)) {
    max_entries_ = std::max<size_t>(16, cache_bytes / std::max<size_t>(1, mask_words(vocab_->trie.vocab()) * 4));
  }
  std::unique_ptr<ConstraintState> start() const override;
  int64_t min_output_bytes() const override { return grammar_.rule_min[grammar_.root]; }

  const Grammar& grammar() const { return grammar_; }
  const VocabData& vocab() const { return *vocab_; }

  // The mask of a state (`key`), computed by `fill` on a miss.
  template <class Fill>
  void cached(const std::string& key, CachedMask& out, Fill fill) const {
    {
      std::lock_guard lock(mutex_);
      if (auto it = cache_.find(key); it != cache_.end()) {
        out = it->second;
        return;
      }
    }
    fill(out);
    std::lock_guard lock(mutex_);
    if (cache_.size() >= max_entries_) cache_.clear();  // a crude bound: states recur, so it refills fast
    cache_.emplace(key, out);
  }

 private:
  Grammar grammar_;
  std::shared_ptr<const VocabData> vocab_;
  size_t max_entries_ = 0;
  mutable std::mutex mutex_;
  mutable std::unordered_map<std::string, CachedMask> cache_;
};

class GrammarState final : public ConstraintState {
 public:
  explicit GrammarState(std::shared_ptr<const GrammarProgram> p) : program_(std::move(p)), stacks_(program_->grammar()) {
    stacks_.start(tops_);
  }

  void fill_mask(std::span<uint32_t> mask, int64_t tokens_left) override {
    std::fill(mask.begin(), mask.end(), 0u);
    const VocabData& v = program_->vocab();
    if (!ended_ && !only_end()) {
      stacks_.key(tops_, key_);
      program_->cached(key_, plain_, [&](CachedMask& out) {
        out.mask.assign(mask.size(), 0u);
        walk(out.mask.data(), UINT64_MAX, UINT64_MAX, &out.max_distance);
      });
      const std::vector<uint32_t>* chosen = &plain_.mask;
      const uint64_t budget = tokens_left > 1 ? uint64_t(tokens_left - 1) : 0;
      if (plain_.max_distance > budget) {
        // Near the length limit: only tokens after which the output can still end in time, counting
        // a byte per token (not cached: it depends on the tokens left). Where none is (the shortest
        // end is longer in bytes than the tokens left), only tokens on a shortest way to the end,
        // which depends on the state alone and is cached beside its plain mask.
        walk(mask.data(), budget, UINT64_MAX, nullptr);
        if (any(mask)) {
          chosen = nullptr;
        } else {
          key_ += '\x01';
          program_->cached(key_, progress_, [&](CachedMask& out) {
            out.mask.assign(mask.size(), 0u);
            walk(out.mask.data(), UINT64_MAX, stacks_.distance(tops_), nullptr);
          });
          if (any(progress_.mask)) chosen = &progress_.mask;
        }
      }
      if (chosen != nullptr) std::copy(chosen->begin(), chosen->end(), mask.begin());
    }
    if (Stacks::accepting(tops_))
      for (int32_t t : v.end_tokens) mask[size_t(t) >> 5] |= 1u << (t & 31);
  }

  bool accept(int32_t token) override {
    const VocabData& v = program_->vocab();
    if (ended_ || token < 0 || size_t(token) >= v.pieces.size()) return false;
    const size_t mark = stacks_.mark();
    if (v.is_end[size_t(token)]) {
      if (!Stacks::accepting(tops_)) return false;
      history_.push_back({tops_, mark});
      ended_ = true;
      return true;
    }
    const std::string& piece = v.pieces[size_t(token)];
    if (piece.empty()) return false;
    std::vector<int32_t> cur = tops_;
    for (char c : piece) {
      stacks_.advance(cur, uint8_t(c), next_);
      if (next_.empty()) {
        stacks_.release(mark);
        return false;
      }
      cur.swap(next_);
    }
    history_.push_back({std::move(tops_), mark});
    tops_ = std::move(cur);
    return true;
  }

  void rollback(int64_t n) override {
    for (; n > 0 && !history_.empty(); --n) {
      tops_ = std::move(history_.back().tops);
      stacks_.release(history_.back().mark);
      history_.pop_back();
      ended_ = false;
    }
  }

  bool finished() const override { return ended_ || only_end(); }

 private:
  struct Step {
    std::vector<int32_t> tops;
    size_t mark;
  };
  bool only_end() const { return tops_.size() == 1 && tops_[0] == grammar::kAccept; }

  void walk(uint32_t* mask, uint64_t budget, uint64_t progress, uint64_t* max_distance) {
    const size_t mark = stacks_.mark();
    TokenTrie::Walk w;
    w.budget = budget;
    w.progress = progress;
    program_->vocab().trie.allowed(stacks_, tops_, mask, w, scratch_);
    stacks_.release(mark);
    if (max_distance != nullptr) *max_distance = w.max_distance;
  }

  std::shared_ptr<const GrammarProgram> program_;
  Stacks stacks_;
  std::vector<int32_t> tops_, next_;
  std::vector<Step> history_;
  bool ended_ = false;
  static bool any(std::span<const uint32_t> mask) {
    return std::any_of(mask.begin(), mask.end(), [](uint32_t w) { return w != 0; });
  }

  std::string key_;
  CachedMask plain_, progress_;
  grammar::WalkScratch scratch_;
};

std::unique_ptr<ConstraintState> GrammarProgram::start() const {
  return std::make_unique<GrammarState>(shared_from_this());
}

// GBNF for one of the request's choices, exactly.
std::string choice_gbnf(const ConstraintSpec& spec) {
  nlohmann::json list;
  try {
    list = nlohmann::json::parse(spec.text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(spec.where + ": not JSON: " + e.what());
  }
  if (!list.is_array() || list.empty()) throw Error(spec.where + ": expected a non-empty list of strings");
  std::string out = "root ::= ";
  for (size_t i = 0; i < list.size(); ++i) {
    if (!list[i].is_string()) throw Error(spec.where + "[" + std::to_string(i) + "]: expected a string");
    if (i > 0) out += " | ";
    out += grammar::gbnf_literal_utf8(list[i].get<std::string>());
  }
  return out + "\n";
}

std::string gbnf_for(const ConstraintSpec& spec) {
  if (spec.type == "grammar") return spec.text;
  if (spec.type == "json_object") return grammar::json_object_gbnf();
  if (spec.type == "regex") return grammar::regex_to_gbnf(spec.text, "root", true);
  if (spec.type == "choice") return choice_gbnf(spec);
  if (spec.type == "json_schema") return grammar::json_schema_text_to_gbnf(spec.text);  // keeps property order
  throw Error(spec.where + ": unknown constraint type '" + spec.type +
              "' (the grammar constraint knows json_object, json_schema, grammar, regex, choice)");
}

class GrammarConstraint final : public Constraint {
 public:
  explicit GrammarConstraint(const Params& p)
      : cache_bytes_(size_t(p.get_int("mask_cache"))), max_grammars_(size_t(p.get_int("max_grammars"))) {
    if (p.get_int("max_grammars") < 1) throw Error("max_grammars must be at least 1, got " + std::to_string(p.get_int("max_grammars")));
    if (p.get_int("mask_cache") < 0) throw Error("mask_cache must not be negative");
  }

  void set_vocabulary(ConstraintVocab vocab) override {
    std::lock_guard lock(mutex_);
    vocab_ = std::make_shared<const VocabData>(std::move(vocab));
    programs_.clear();
    order_.clear();
  }

  std::shared_ptr<const CompiledConstraint> compile(const ConstraintSpec& spec) const override {
    std::shared_ptr<const VocabData> vocab;
    std::string key = spec.type + '\0' + spec.text;
    {
      std::lock_guard lock(mutex_);
      if (vocab_ == nullptr) throw Error(spec.where + ": the constraint has no vocabulary (no model loaded)");
      vocab = vocab_;
      if (auto it = programs_.find(key); it != programs_.end()) {
        order_.splice(order_.begin(), order_, it->second.second);
        return it->second.first;
      }
    }
    std::string text;
    try {
      text = gbnf_for(spec);
    } catch (const Error& e) {
      const std::string what = e.what();
      // The converters name the keyword or position; add where it came from once.
      throw Error(what.rfind(spec.where, 0) == 0 ? what : spec.where + ": " + what);
    }
    auto program = std::make_shared<const GrammarProgram>(grammar::parse_gbnf(text, spec.where), vocab, cache_bytes_);
    std::lock_guard lock(mutex_);
    if (vocab != vocab_) return program;  // the vocabulary changed meanwhile: do not cache
    if (programs_.count(key) == 0) {
      order_.push_front(key);
      programs_.emplace(key, std::make_pair(program, order_.begin()));
      while (programs_.size() > max_grammars_) {
        programs_.erase(order_.back());
        order_.pop_back();
      }
    }
    return program;
  }

 private:
  size_t cache_bytes_;
  size_t max_grammars_;
  mutable std::mutex mutex_;
  std::shared_ptr<const VocabData> vocab_;
  mutable std::list<std::string> order_;  // most recently used first
  mutable std::unordered_map<std::string, std::pair<std::shared_ptr<const GrammarProgram>, std::list<std::string>::iterator>> programs_;
};

void register_grammar(Registrar& r) {
  r.add<Constraint>(
      "grammar", "JSON mode, JSON Schema, GBNF grammars, regular expressions and choices as token masks",
      {{"mask_cache", ParamType::size, "64MiB", "memory for cached token masks per compiled grammar"},
       {"max_grammars", ParamType::integer, 64, "compiled grammars kept for reuse (by type and text)"}},
      [](const Params& p) { return std::make_unique<GrammarConstraint>(p); });
}

}  // namespace
}  // namespace tessera

TESSERA_PLUGIN("constraint_grammar", tessera::register_grammar)
