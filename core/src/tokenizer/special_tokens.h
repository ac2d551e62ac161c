// Cutting text at the vocabulary's special tokens before the text between them is tokenized, as
// llama.cpp's tokenizer_st_partition does: user-defined tokens (TokenType 4) always, control and
// unknown-type tokens only with parse_special; the longest texts claim their places first (equal
// lengths: the lower id first), each token's occurrences left to right, never across a place an
// earlier (longer) token took.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

#include "tessera/tokenizer.h"

namespace tessera::tokenizer_detail {

struct Fragment {
  std::string_view text;  // a view into the text given to partition (the token's place, for a token)
  int32_t token = -1;     // a special token, or -1 for text
};

class SpecialTokens {
 public:
  // `v` must have its types filled in (the Tokenizer base does that).
  explicit SpecialTokens(const Vocabulary& v);

  // The text as special tokens and the (non-empty) text between them, in order.
  std::vector<Fragment> partition(std::string_view text, bool parse_special) const;

 private:
  // A byte trie over the special tokens' texts. Each node that ends a token holds the lowest id of
  // that text among all eligible tokens (`any`) and among user-defined ones (`user`).
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;  // byte -> node
    int32_t any = -1, user = -1;
    uint32_t depth = 0;
  };
  int32_t child(int32_t node, uint8_t byte) const;

  std::vector<Node> nodes_;  // nodes_[0] is the root
  std::array<int32_t, 256> root_;  // the root's children as a table: every text position looks there
  bool has_user_ = false, has_any_ = false;
};

}  // namespace tessera::tokenizer_detail
