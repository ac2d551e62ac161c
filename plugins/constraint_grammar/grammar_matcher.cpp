#include "grammar_matcher.h"

#include <algorithm>

#include "tessera/error.h"

namespace tessera::grammar {
namespace {

// An ambiguous grammar ("x* x*") can hold many stacks at once; past this many the request fails with
// a message instead of taking unbounded time and memory.
constexpr size_t kMaxStacks = 4096;

}  // namespace

int32_t Stacks::push(uint32_t pos, int32_t parent) {
  auto [it, added] = index_.try_emplace(frame_key(pos, parent), int32_t(frames_.size()));
  if (added) frames_.push_back({pos, parent});
  return it->second;
}

void Stacks::release(size_t mark) {
  for (size_t i = mark; i < frames_.size(); ++i) index_.erase(frame_key(frames_[i].pos, frames_[i].parent));
  frames_.resize(mark);
}

void Stacks::expand(uint32_t pos, int32_t parent, std::vector<int32_t>& out) {
  const Grammar& g = *g_;
  work_.clear();
  work_.push_back({pos, parent});
  while (!work_.empty()) {
    auto [p, up] = work_.back();
    work_.pop_back();
    const Element e = g.code[p];
    if (e.op == Op::kBytes) {
      // Equal stacks reached along different paths are one parse (one id): without merging them an
      // ambiguous grammar ((a|ab)* ...) would double its stacks at every step.
      const int32_t id = push(p, up);
      if (std::find(out.begin(), out.end(), id) == out.end()) {
        if (out.size() >= kMaxStacks)
          throw Error("grammar: more than " + std::to_string(kMaxStacks) + " parses at once (the grammar is too ambiguous)");
        out.push_back(id);
      }
    } else if (e.op == Op::kEnd) {
      if (up == kAccept) {
        if (std::find(out.begin(), out.end(), kAccept) == out.end()) out.push_back(kAccept);
      } else {
        const Frame f = frames_[size_t(up)];
        work_.push_back({f.pos + 1, f.parent});
      }
    } else {
      // A rule in tail position returns straight to our parent: repetition (R ::= x R) keeps the
      // stack depth constant.
      const int32_t cont = g.code[p + 1].op == Op::kEnd ? up : push(p, up);
      const auto& alts = g.alternatives[e.arg];
      for (auto it = alts.rbegin(); it != alts.rend(); ++it) work_.push_back({*it, cont});
    }
  }
}

void Stacks::start(std::vector<int32_t>& out) {
  out.clear();
  for (uint32_t a : g_->alternatives[g_->root]) expand(a, kAccept, out);
  std::sort(out.begin(), out.end());
}

void Stacks::advance(const std::vector<int32_t>& tops, uint8_t byte, std::vector<int32_t>& out) {
  out.clear();
  for (int32_t t : tops) {
    if (t == kAccept) continue;
    const Frame f = frames_[size_t(t)];
    if (g_->sets[g_->code[f.pos].arg].has(byte)) expand(f.pos + 1, f.parent, out);
  }
  std::sort(out.begin(), out.end());
}

uint64_t Stacks::distance(const std::vector<int32_t>& tops) const {
  uint64_t best = kNever;
  for (int32_t t : tops) {
    if (t == kAccept) return 0;
    uint64_t d = g_->min_bytes[frames_[size_t(t)].pos];
    for (int32_t up = frames_[size_t(t)].parent; up != kAccept; up = frames_[size_t(up)].parent)
      d += g_->min_bytes[frames_[size_t(up)].pos + 1];
    best = std::min(best, d);
  }
  return best;
}

bool Stacks::accepting(const std::vector<int32_t>& tops) {
  return std::find(tops.begin(), tops.end(), kAccept) != tops.end();
}

void Stacks::key(const std::vector<int32_t>& tops, std::string& out) const {
  std::vector<std::string> stacks;
  stacks.reserve(tops.size());
  for (int32_t t : tops) {
    std::string s;
    for (int32_t f = t; f != kAccept; f = frames_[size_t(f)].parent) {
      const uint32_t p = frames_[size_t(f)].pos;
      s.append(reinterpret_cast<const char*>(&p), sizeof p);
    }
    s += '\n';  // the empty stack (kAccept) is "\n"; positions are 4 bytes each, so no ambiguity
    stacks.push_back(std::move(s));
  }
  std::sort(stacks.begin(), stacks.end());
  out.clear();
  for (const std::string& s : stacks) {
    const auto n = static_cast<uint32_t>(s.size());
    out.append(reinterpret_cast<const char*>(&n), sizeof n);
    out += s;
  }
}

bool grammar_accepts(const Grammar& g, std::string_view bytes) {
  Stacks stacks(g);
  std::vector<int32_t> tops, next;
  stacks.start(tops);
  for (char c : bytes) {
    stacks.advance(tops, static_cast<uint8_t>(c), next);
    if (next.empty()) return false;
    tops.swap(next);
  }
  return Stacks::accepting(tops);
}

}  // namespace tessera::grammar
