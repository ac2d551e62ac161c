// Text <-> token ids. The vocabulary comes from a GGUF file's tokenizer.ggml.* keys; the algorithm is
// picked by tokenizer.ggml.model: "llama" (SentencePiece BPE) or "gpt2" (byte-level BPE, with the
// pre-tokenizer named by tokenizer.ggml.pre). Implementations live in core/src/tokenizer/.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tessera {

class GgufFile;

// SentencePiece / llama.cpp token types (tokenizer.ggml.token_type).
enum TokenType : int32_t {
  kTokenUndefined = 0,
  kTokenNormal = 1,
  kTokenUnknown = 2,
  kTokenControl = 3,
  kTokenUserDefined = 4,
  kTokenUnused = 5,
  kTokenByte = 6,
};

struct Vocabulary {
  std::string model;  // tokenizer.ggml.model: "llama" (SentencePiece BPE) or "gpt2" (byte-level BPE)
  std::string pre;    // tokenizer.ggml.pre: the byte-level BPE's pre-tokenizer ("llama-bpe", ...); "" = absent
  std::vector<std::string> tokens;
  std::vector<float> scores;     // empty = all 0
  std::vector<int32_t> types;    // empty = inferred (BYTE for "<0xNN>", NORMAL otherwise)
  std::vector<std::string> merges;  // byte-level BPE: "left right", highest priority first
  int32_t bos = -1, eos = -1, unk = -1, pad = -1;
  bool add_bos = true;
  bool add_eos = false;
  bool add_space_prefix = true;
};

// Reads tokenizer.ggml.{model, pre, tokens, scores, token_type, merges, bos_token_id, eos_token_id,
// unknown_token_id, padding_token_id, add_bos_token, add_eos_token, add_space_prefix}. Throws Error when tokens are
// missing, arrays disagree in length, or a special id is outside the vocabulary. Defaults for absent
// keys are llama.cpp's (see load_vocabulary).
Vocabulary load_vocabulary(const GgufFile& f);

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Token ids of `text`, as llama.cpp's llama_tokenize: user-defined tokens (TokenType 4) always
  // match as whole tokens; without parse_special the texts of control tokens ("<s>",
  // "<|endoftext|>") are plain text, with it they (and unknown-type tokens) become those tokens too,
  // the longest first. With add_special, BOS first and EOS last where the vocabulary asks for them
  // (add_bos, add_eos). Thread-safe: encode may run on several threads at once.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special = false) const = 0;
  // Text of a sequence. SentencePiece: the space that encode puts in front of the text is removed
  // after BOS, so decode(encode(x, true)) == x where the vocabulary adds BOS and x holds no
  // user-defined token (the text after one keeps the space encode put before it, as in llama.cpp);
  // a completion decoded alone (no BOS) keeps its leading space, as it continues a prompt.
  // Byte-level BPE adds no space: decode(encode(x, s)) == x for any x (control tokens give "").
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  // Raw bytes of one token: byte tokens give their byte, U+2581 becomes a space (SentencePiece) and
  // byte-level characters their bytes (gpt2), control tokens give "", user-defined tokens their
  // text. Concatenating pieces (e.g. when streaming) yields valid UTF-8 once all bytes arrive.
  virtual std::string token_to_piece(int32_t id) const = 0;

  int32_t bos() const { return vocab_.bos; }
  int32_t eos() const { return vocab_.eos; }
  int32_t vocab_size() const { return static_cast<int32_t>(vocab_.tokens.size()); }
  const Vocabulary& vocabulary() const { return vocab_; }

  // Picks the implementation by v.model ("llama", "gpt2"); throws Error for any other model, and
  // for a "gpt2" vocabulary whose pre-tokenizer (v.pre) is unknown.
  static std::unique_ptr<Tokenizer> create(Vocabulary v);

 protected:
  // Validates sizes and ids, fills empty scores/types.
  explicit Tokenizer(Vocabulary v);
  // Throws Error naming the id when it is outside the vocabulary.
  void check_id(int32_t id) const;

  Vocabulary vocab_;
};

}  // namespace tessera
