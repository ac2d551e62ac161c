#include "special_tokens.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "tessera/error.h"

namespace tessera::tokenizer_detail {

SpecialTokens::SpecialTokens(const Vocabulary& v) {
  nodes_.emplace_back();
  root_.fill(-1);
  for (size_t id = 0; id < v.tokens.size(); ++id) {
    const int32_t type = v.types[id];
    const bool user = type == kTokenUserDefined;
    if (!user && type != kTokenControl && type != kTokenUnknown) continue;
    const std::string& text = v.tokens[id];
    if (text.empty()) continue;
    int32_t node = 0;
    for (const char c : text) {
      int32_t next = child(node, static_cast<uint8_t>(c));
      if (next < 0) {
        next = static_cast<int32_t>(nodes_.size());
        const uint32_t depth = nodes_[size_t(node)].depth + 1;
        nodes_[size_t(node)].children.emplace_back(static_cast<uint8_t>(c), next);
        nodes_.emplace_back();
        nodes_.back().depth = depth;
      }
      node = next;
    }
    // Ids ascend, so the first id of a text is its lowest (duplicates: the lower id wins).
    Node& n = nodes_[size_t(node)];
    if (n.any < 0) n.any = static_cast<int32_t>(id);
    if (user && n.user < 0) n.user = static_cast<int32_t>(id);
    has_any_ = true;
    has_user_ = has_user_ || user;
  }
  for (const auto& [b, next] : nodes_[0].children) root_[b] = next;
}

int32_t SpecialTokens::child(int32_t node, uint8_t byte) const {
  for (const auto& [b, next] : nodes_[size_t(node)].children) {
    if (b == byte) return next;
  }
  return -1;
}

std::vector<Fragment> SpecialTokens::partition(std::string_view text, bool parse_special) const {
  if (text.empty()) return {};
  if (!(parse_special ? has_any_ : has_user_)) return {{text}};
  if (text.size() > UINT32_MAX) throw Error("tokenizer: a text of " + std::to_string(text.size()) + " bytes is too long");

  // Every place where an eligible token's text occurs, found in one pass over the trie.
  struct Candidate {
    uint32_t pos, len;
    int32_t id;
  };
  std::vector<Candidate> found;
  const uint8_t* s = reinterpret_cast<const uint8_t*>(text.data());
  for (size_t i = 0; i < text.size(); ++i) {
    int32_t node = root_[s[i]];
    for (size_t j = i + 1; node >= 0; node = j < text.size() ? child(node, s[j++]) : -1) {
      const Node& n = nodes_[size_t(node)];
      const int32_t id = parse_special ? n.any : n.user;
      if (id >= 0) found.push_back({static_cast<uint32_t>(i), n.depth, id});
    }
  }
  if (found.empty()) return {{text}};

  // llama.cpp's order: longer tokens first (ties: lower id), each token's places left to right; a
  // place overlapping one already taken is skipped.
  std::sort(found.begin(), found.end(), [](const Candidate& a, const Candidate& b) {
    if (a.len != b.len) return a.len > b.len;
    if (a.id != b.id) return a.id < b.id;
    return a.pos < b.pos;
  });
  std::vector<uint8_t> taken(text.size(), 0);
  std::vector<Candidate> kept;
  for (const Candidate& c : found) {
    if (std::any_of(taken.begin() + c.pos, taken.begin() + c.pos + c.len, [](uint8_t t) { return t != 0; })) continue;
    std::fill(taken.begin() + c.pos, taken.begin() + c.pos + c.len, uint8_t{1});
    kept.push_back(c);
  }
  std::sort(kept.begin(), kept.end(), [](const Candidate& a, const Candidate& b) { return a.pos < b.pos; });

  std::vector<Fragment> parts;
  size_t at = 0;
  for (const Candidate& c : kept) {
    if (c.pos > at) parts.push_back({text.substr(at, c.pos - at)});
    parts.push_back({text.substr(c.pos, c.len), c.id});
    at = c.pos + c.len;
  }
  if (at < text.size()) parts.push_back({text.substr(at)});
  return parts;
}

}  // namespace tessera::tokenizer_detail
