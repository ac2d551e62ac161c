// SentencePiece-style BPE (tokenizer.ggml.model = "llama"), as llama.cpp's SPM tokenizer does it:
// spaces become U+2581, the text is split into UTF-8 characters, and the adjacent pair whose
// concatenation is the highest-scoring vocabulary token is merged until no pair is a token.
// Characters that are no token fall back to <0xNN> byte tokens. User-defined tokens (added
// pieces such as "<|user|>"), and with parse_special control tokens, are cut out of the text first
// (special_tokens.h) and never split.
#include <algorithm>
#include <array>
#include <functional>
#include <queue>
#include <string>
#include <unordered_map>
#include <vector>

#include "special_tokens.h"
#include "tessera/error.h"
#include "tessera/tokenizer.h"

namespace tessera {

namespace {

using tokenizer_detail::Fragment;
using tokenizer_detail::SpecialTokens;

constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK
constexpr std::string_view kUnknownPiece = "\xE2\x96\x85";  // what llama.cpp prints for <unk>

// Length of the UTF-8 character at s[i]. A malformed sequence counts as one byte, so it becomes
// its own byte token and cannot swallow the first bytes of a following U+2581 (which would turn a
// space into a literal "\xE2\x96\x81" on decode).
size_t utf8_char_len(std::string_view s, size_t i) {
  const auto lead = static_cast<unsigned char>(s[i]);
  size_t len = lead < 0x80 ? 1 : lead < 0xC0 ? 0 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : lead < 0xF8 ? 4 : 0;
  if (len == 0 || i + len > s.size()) return 1;
  for (size_t k = 1; k < len; ++k) {
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 1;
  }
  return len;
}

int parse_byte_token(std::string_view s) {
  if (s.size() != 6 || s.substr(0, 3) != "<0x" || s[5] != '>') return -1;
  int v = 0;
  for (size_t i = 3; i < 5; ++i) {
    const char c = s[i];
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else return -1;
    v = v * 16 + d;
  }
  return v;
}

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    if (s.substr(i, from.size()) == from) {
      out += to;
      i += from.size();
    } else {
      out += s[i++];
    }
  }
  return out;
}

struct StrHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

class SpmTokenizer final : public Tokenizer {
 public:
  explicit SpmTokenizer(Vocabulary v) : Tokenizer(std::move(v)), special_(vocab_) {
    const auto n = static_cast<int32_t>(vocab_.tokens.size());
    byte_ids_.fill(-1);
    pieces_.resize(n);
    token_ids_.reserve(n);
    for (int32_t id = 0; id < n; ++id) {
      const std::string& text = vocab_.tokens[id];
      token_ids_[text] = id;  // later duplicates win, as in llama.cpp
      switch (vocab_.types[id]) {
        case kTokenByte: {
          const int b = parse_byte_token(text);
          if (b < 0) {
            pieces_[id] = text;
          } else {
            pieces_[id] = std::string(1, static_cast<char>(b));
            if (byte_ids_[b] < 0) byte_ids_[b] = id;
          }
          break;
        }
        case kTokenControl:
        case kTokenUnused: break;  // no text
        case kTokenUnknown: pieces_[id] = kUnknownPiece; break;
        case kTokenUserDefined: pieces_[id] = text; break;
        default: pieces_[id] = replace_all(text, kSpaceMarker, " "); break;
      }
    }
  }

  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const override {
    std::vector<int32_t> out;
    if (add_special && vocab_.add_bos && vocab_.bos >= 0) out.push_back(vocab_.bos);
    // The text between special tokens goes through BPE, with the space prefix at the start and
    // after each such token (as llama.cpp prefixes the text after a special token; Hugging Face's
    // Llama tokenizer gives "<s>Hi" as <s> "▁Hi" too).
    bool after_token = true;
    for (const Fragment& f : special_.partition(text, parse_special)) {
      if (f.token >= 0) {
        out.push_back(f.token);
      } else {
        encode_text(f.text, after_token && vocab_.add_space_prefix, out);
      }
      after_token = f.token >= 0;
    }
    if (add_special && vocab_.add_eos && vocab_.eos >= 0) out.push_back(vocab_.eos);
    return out;
  }

  std::string decode(std::span<const int32_t> ids) const override {
    std::string out;
    bool after_bos = false;
    for (int32_t id : ids) {
      check_id(id);
      const std::string& piece = pieces_[id];
      // Undo the space encode put in front of the text: it follows BOS. A completion decoded on its
      // own (no BOS) keeps its leading space, as it reads after the prompt.
      if (after_bos && vocab_.add_space_prefix && !piece.empty() && piece[0] == ' ') {
        out.append(piece, 1);
      } else {
        out += piece;
      }
      after_bos = id == vocab_.bos || (after_bos && piece.empty());
    }
    return out;
  }

  std::string token_to_piece(int32_t id) const override {
    check_id(id);
    return pieces_[id];
  }

 private:
  // One piece of text (no special token in it) through BPE, its ids appended to out.
  void encode_text(std::string_view text, bool space_prefix, std::vector<int32_t>& out) const {
    std::string s = space_prefix ? std::string(kSpaceMarker) : std::string();
    s += replace_all(text, " ", kSpaceMarker);
    if (s.empty()) return;

    // Symbols form a linked list over s; a merged-away symbol has len 0.
    struct Symbol {
      int32_t prev, next;
      uint32_t start, len;
    };
    std::vector<Symbol> sym;
    sym.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
      const size_t len = utf8_char_len(s, i);
      const auto idx = static_cast<int32_t>(sym.size());
      sym.push_back({idx - 1, idx + 1, static_cast<uint32_t>(i), static_cast<uint32_t>(len)});
      i += len;
    }
    sym.back().next = -1;

    struct Bigram {
      float score;
      int32_t left, right;
      uint32_t len;
    };
    // Highest score first; on ties the leftmost pair.
    auto lower = [](const Bigram& a, const Bigram& b) {
      return a.score < b.score || (a.score == b.score && a.left > b.left);
    };
    std::priority_queue<Bigram, std::vector<Bigram>, decltype(lower)> queue(lower);
    auto try_add = [&](int32_t left, int32_t right) {
      if (left < 0 || right < 0) return;
      const uint32_t len = sym[left].len + sym[right].len;
      const auto it = token_ids_.find(std::string_view(s).substr(sym[left].start, len));
      if (it != token_ids_.end()) queue.push({vocab_.scores[it->second], left, right, len});
    };
    for (size_t i = 1; i < sym.size(); ++i) try_add(static_cast<int32_t>(i - 1), static_cast<int32_t>(i));

    while (!queue.empty()) {
      const Bigram b = queue.top();
      queue.pop();
      Symbol& l = sym[b.left];
      Symbol& r = sym[b.right];
      // Stale entry: one side was merged into something else since it was queued.
      if (l.len == 0 || r.len == 0 || l.len + r.len != b.len) continue;
      l.len += r.len;
      r.len = 0;
      l.next = r.next;
      if (r.next >= 0) sym[r.next].prev = b.left;
      try_add(l.prev, b.left);
      try_add(b.left, l.next);
    }

    for (int32_t i = 0; i >= 0; i = sym[i].next) {
      const std::string_view piece = std::string_view(s).substr(sym[i].start, sym[i].len);
      const auto it = token_ids_.find(piece);
      if (it != token_ids_.end()) {
        out.push_back(it->second);
        continue;
      }
      bool all_bytes = true;
      for (char c : piece) all_bytes = all_bytes && byte_ids_[static_cast<unsigned char>(c)] >= 0;
      if (all_bytes) {
        for (char c : piece) out.push_back(byte_ids_[static_cast<unsigned char>(c)]);
      } else if (vocab_.unk >= 0) {
        out.push_back(vocab_.unk);
      } else {
        throw Error("tokenizer: cannot encode '" + std::string(piece) +
                    "': it is not in the vocabulary, which has neither byte tokens nor <unk>");
      }
    }
  }

  std::unordered_map<std::string, int32_t, StrHash, std::equal_to<>> token_ids_;
  std::array<int32_t, 256> byte_ids_{};
  std::vector<std::string> pieces_;  // token_to_piece, precomputed
  SpecialTokens special_;
};

}  // namespace

std::unique_ptr<Tokenizer> create_spm_tokenizer(Vocabulary v) {
  return std::make_unique<SpmTokenizer>(std::move(v));
}

}  // namespace tessera
