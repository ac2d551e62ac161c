// Token masks: which tokens of the vocabulary a grammar allows from a set of stacks. The vocabulary
// is a byte trie stored in preorder, so one walk advances the stacks once per trie edge, shares the
// work of tokens with a common prefix, and skips a whole subtree as soon as its prefix is refused.
// Within a walk, transitions (set of stacks, byte) -> set are memoized: inside a string or a
// repetition the stacks return to the same set after each byte, so most edges cost one lookup.
#pragma once

#include <cstdint>
#include <array>
#include <string>
#include <unordered_map>
#include <vector>

#include "grammar_matcher.h"

namespace tessera::grammar {

// One walk's memo (kept by the caller so that its memory is reused).
struct WalkScratch {
  std::vector<std::vector<int32_t>> sets;             // interned sets of stacks
  std::unordered_map<std::string, int32_t> ids;       // a set's frame ids (as bytes) -> its index
  std::vector<std::array<int32_t, 256>> next;         // per set and byte: kUnknown, kEmpty or a set
  std::vector<uint64_t> distance;                     // per set: bytes to an end (kUnknownDistance)
  std::vector<int32_t> level;                         // the set at each trie depth
  std::vector<int32_t> tmp;
  std::string key;
};

class TokenTrie {
 public:
  // Tokens with empty pieces (control tokens) are left out: no grammar allows them.
  explicit TokenTrie(const std::vector<std::string>& pieces);
  int64_t vocab() const { return vocab_; }

  struct Walk {
    uint64_t budget = UINT64_MAX;  // allow only tokens after which the output can end within this many bytes
    // Allow only tokens on a shortest way to an end from a state this many bytes from one (each
    // allowed token brings the end as much closer as it is long).
    uint64_t progress = UINT64_MAX;
    uint64_t max_distance = 0;     // out: the most bytes to an end after any allowed token
  };
  // Sets the bit of every token the stacks take whole (the rest of `mask` is left as it is).
  void allowed(Stacks& stacks, const std::vector<int32_t>& tops, uint32_t* mask, Walk& walk, WalkScratch& s) const;

 private:
  int64_t vocab_ = 0;
  // Node i (preorder; node 0 is the root): the byte on its edge, its depth, the node after its
  // subtree, and its tokens tokens_[first_[i], first_[i + 1]).
  std::vector<uint8_t> byte_;
  std::vector<uint32_t> depth_;
  std::vector<uint32_t> skip_;
  std::vector<uint32_t> first_;
  std::vector<int32_t> tokens_;
  uint32_t max_depth_ = 0;
};

}  // namespace tessera::grammar
