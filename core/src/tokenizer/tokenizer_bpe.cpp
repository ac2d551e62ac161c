// Byte-level BPE (tokenizer.ggml.model = "gpt2"), as GPT-2, Llama 3, Qwen2, Falcon, StarCoder and
// DeepSeek tokenize: special tokens are cut out first (special_tokens.h), the pre-tokenizer named by
// tokenizer.ggml.pre cuts the rest into words, and each word's bytes, written in GPT-2's byte
// alphabet (every byte a printable character: 'Ġ' for a space), are merged pairwise by the rank of
// tokenizer.ggml.merges, the lowest rank first (ties: the leftmost pair).
#include <algorithm>
#include <array>
#include <functional>
#include <queue>
#include <string>
#include <unordered_map>
#include <vector>

#include "pretokenizer.h"
#include "special_tokens.h"
#include "tessera/error.h"
#include "tessera/tokenizer.h"

namespace tessera {

namespace {

using tokenizer_detail::Fragment;
using tokenizer_detail::PreTokenizer;
using tokenizer_detail::SpecialTokens;

void append_utf8(std::string& s, uint32_t cp) {
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Decodes the UTF-8 character at s[i] into cp and returns its length; a malformed one gives 0.
size_t next_utf8(std::string_view s, size_t i, uint32_t& cp) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char lead = b(0);
  size_t len = lead < 0x80 ? 1 : lead < 0xC0 ? 0 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : lead < 0xF8 ? 4 : 0;
  if (len == 0 || i + len > s.size()) return 0;
  cp = len == 1 ? lead : lead & (0x7F >> len);
  for (size_t k = 1; k < len; ++k) {
    if ((b(k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b(k) & 0x3F);
  }
  return len;
}

// GPT-2's byte alphabet: printable Latin-1 bytes stand for themselves, the other 68 (controls,
// space, DEL, NBSP, soft hyphen) for U+0100 onwards, in byte order.
struct ByteAlphabet {
  std::array<uint32_t, 256> to_cp{};
  std::array<int16_t, 256 + 68> to_byte{};
  ByteAlphabet() {
    to_byte.fill(-1);
    uint32_t extra = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
      to_cp[b] = printable ? b : extra++;
      to_byte[to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};
const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}

struct StrHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(Vocabulary v)
      : Tokenizer(std::move(v)), pre_(vocab_.pre.empty() ? "default" : vocab_.pre), special_(vocab_) {
    const ByteAlphabet& abc = alphabet();
    const auto n = static_cast<int32_t>(vocab_.tokens.size());
    token_ids_.reserve(size_t(n));
    pieces_.resize(size_t(n));
    for (int32_t id = 0; id < n; ++id) {
      const std::string& text = vocab_.tokens[size_t(id)];
      token_ids_[text] = id;  // later duplicates win, as in llama.cpp
      switch (vocab_.types[size_t(id)]) {
        case kTokenControl:
        case kTokenUnknown:
        case kTokenUnused: break;  // no text, as llama.cpp's token_to_piece without specials
        case kTokenUserDefined: pieces_[size_t(id)] = text; break;  // added text, stored as written
        default: pieces_[size_t(id)] = unmap(text); break;
      }
    }
    byte_ids_.fill(-1);
    for (int b = 0; b < 256; ++b) {
      std::string ch;
      append_utf8(ch, abc.to_cp[size_t(b)]);
      if (const auto it = token_ids_.find(ch); it != token_ids_.end()) byte_ids_[size_t(b)] = it->second;
    }
    merges_.reserve(vocab_.merges.size());
    for (size_t rank = 0; rank < vocab_.merges.size(); ++rank) {
      const std::string& m = vocab_.merges[rank];
      const size_t sp = m.find(' ', 1);
      if (sp == std::string::npos) {
        throw Error("tokenizer: tokenizer.ggml.merges[" + std::to_string(rank) + "] = '" + m +
                    "' is not two tokens separated by a space");
      }
      const std::string_view left = std::string_view(m).substr(0, sp), right = std::string_view(m).substr(sp + 1);
      const auto l = token_ids_.find(left), r = token_ids_.find(right);
      const auto joined = token_ids_.find(std::string(left) + std::string(right));
      // A merge of or into text that is no token can never apply (Hugging Face refuses such files).
      if (l == token_ids_.end() || r == token_ids_.end() || joined == token_ids_.end()) continue;
      merges_.try_emplace(pair_key(l->second, r->second), Merge{static_cast<uint32_t>(rank), joined->second});
    }
  }

  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const override {
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 2);
    if (add_special && vocab_.add_bos && vocab_.bos >= 0) out.push_back(vocab_.bos);
    Scratch sc;
    for (const Fragment& f : special_.partition(text, parse_special)) {
      if (f.token >= 0) {
        out.push_back(f.token);
        continue;
      }
      sc.words.clear();
      pre_.split(f.text, sc.words);
      for (const std::string_view w : sc.words) encode_word(w, sc, out);
    }
    if (add_special && vocab_.add_eos && vocab_.eos >= 0) out.push_back(vocab_.eos);
    return out;
  }

  std::string decode(std::span<const int32_t> ids) const override {
    std::string out;
    for (const int32_t id : ids) {
      check_id(id);
      out += pieces_[size_t(id)];
    }
    return out;
  }

  std::string token_to_piece(int32_t id) const override {
    check_id(id);
    return pieces_[size_t(id)];
  }

 private:
  struct Merge {
    uint32_t rank;
    int32_t result;
  };
  struct Symbol {
    int32_t id;  // token id; -2 once merged into its left neighbour
    int32_t prev, next;
  };
  struct Candidate {
    uint32_t rank;
    int32_t left, right;  // symbol indices
    int32_t left_id, right_id;
    int32_t result;  // the merged token
  };
  struct CandidateAfter {  // the lowest rank on top; ties: the leftmost pair
    bool operator()(const Candidate& a, const Candidate& b) const {
      return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
    }
  };
  // Buffers one encode call reuses across its words (one per call: encode is thread-safe).
  struct Scratch {
    std::vector<std::string_view> words;
    std::vector<Symbol> sym;
    std::vector<Candidate> heap;
    std::string mapped;
  };

  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }

  // A token's text back to bytes: characters of the byte alphabet give their byte; any other
  // character (none in a well-formed vocabulary) stays as written.
  static std::string unmap(std::string_view text) {
    const ByteAlphabet& abc = alphabet();
    std::string out;
    out.reserve(text.size());
    for (size_t i = 0; i < text.size();) {
      uint32_t cp = 0;
      const size_t len = next_utf8(text, i, cp);
      if (len == 0) {
        out += text[i++];
        continue;
      }
      if (cp < abc.to_byte.size() && abc.to_byte[cp] >= 0) {
        out += static_cast<char>(abc.to_byte[cp]);
      } else {
        out.append(text, i, len);
      }
      i += len;
    }
    return out;
  }

  void push_symbol(int32_t id, std::vector<int32_t>& out) const {
    if (id >= 0) {
      out.push_back(id);
    } else if (vocab_.unk >= 0) {
      out.push_back(vocab_.unk);
    } else {
      throw Error("tokenizer: a byte has no token in this byte-level vocabulary, which has no <unk> either");
    }
  }

  const Merge* find_merge(int32_t left, int32_t right) const {
    if (left < 0 || right < 0) return nullptr;
    const auto it = merges_.find(pair_key(left, right));
    return it == merges_.end() ? nullptr : &it->second;
  }

  void encode_word(std::string_view word, Scratch& sc, std::vector<int32_t>& out) const {
    if (word.size() == 1) return push_symbol(byte_ids_[static_cast<unsigned char>(word[0])], out);
    if (pre_.ignore_merges()) {  // a word that is a token is taken whole
      const ByteAlphabet& abc = alphabet();
      sc.mapped.clear();
      for (const char c : word) append_utf8(sc.mapped, abc.to_cp[static_cast<unsigned char>(c)]);
      if (const auto it = token_ids_.find(std::string_view(sc.mapped)); it != token_ids_.end()) {
        out.push_back(it->second);
        return;
      }
    }
    const auto n = static_cast<int32_t>(word.size());
    sc.sym.resize(size_t(n));
    for (int32_t i = 0; i < n; ++i) sc.sym[size_t(i)] = {byte_ids_[static_cast<unsigned char>(word[size_t(i)])], i - 1, i + 1};
    sc.sym.back().next = -1;

    auto& heap = sc.heap;
    heap.clear();
    auto try_add = [&](int32_t left, int32_t right) {
      if (left < 0 || right < 0) return;
      const int32_t a = sc.sym[size_t(left)].id, b = sc.sym[size_t(right)].id;
      if (const Merge* m = find_merge(a, b)) {
        heap.push_back({m->rank, left, right, a, b, m->result});
        std::push_heap(heap.begin(), heap.end(), CandidateAfter{});
      }
    };
    for (int32_t i = 1; i < n; ++i) try_add(i - 1, i);
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), CandidateAfter{});
      const Candidate c = heap.back();
      heap.pop_back();
      Symbol& l = sc.sym[size_t(c.left)];
      Symbol& r = sc.sym[size_t(c.right)];
      // Stale: either side changed (merged on its other side) since this pair was queued.
      if (l.id != c.left_id || r.id != c.right_id || l.next != c.right) continue;
      l.id = c.result;
      r.id = -2;
      l.next = r.next;
      if (r.next >= 0) sc.sym[size_t(r.next)].prev = c.left;
      try_add(l.prev, c.left);
      try_add(c.left, l.next);
    }
    for (int32_t i = 0; i >= 0; i = sc.sym[size_t(i)].next) push_symbol(sc.sym[size_t(i)].id, out);
  }

  PreTokenizer pre_;
  SpecialTokens special_;
  std::unordered_map<std::string, int32_t, StrHash, std::equal_to<>> token_ids_;
  std::unordered_map<uint64_t, Merge> merges_;  // (left id, right id) -> rank, merged token
  std::array<int32_t, 256> byte_ids_{};         // the token of each byte's character, -1 if none
  std::vector<std::string> pieces_;             // token_to_piece, precomputed
};

}  // namespace

std::unique_ptr<Tokenizer> create_bpe_tokenizer(Vocabulary v) {
  return std::make_unique<BpeTokenizer>(std::move(v));
}

}  // namespace tessera
